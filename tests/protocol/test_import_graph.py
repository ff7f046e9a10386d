"""The code's imports form no circle, and the layers import downward only (imports inside functions count).

The graph is read from the source with ``ast``: every ``import`` and ``from ... import`` in a module, at any depth,
resolved to the project's modules (``from package import name`` counts ``package.name`` when that is a module).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"diffgemma_lsp": "diffgemma_lsp", "diffgemma_engine": "engine", "benchmarks": "benchmarks"}
"""Import name -> folder."""


def project_modules() -> dict[str, Path]:
    """Every module of the project by its import name."""
    modules: dict[str, Path] = {}
    for name, folder in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            parts = [name, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``module`` imports."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            targets = [source, *(f"{source}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(target for target in targets if target in known and target != module)
    return found


def import_graph() -> dict[str, set[str]]:
    known = project_modules()
    return {module: imports_of(module, path, known) for module, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_the_graph_is_read() -> None:
    graph = import_graph()
    assert "diffgemma_engine.canvas.step" in graph["diffgemma_engine.canvas.denoise"]
    assert "diffgemma_lsp.features.completion" in graph["diffgemma_lsp.server"]


def test_cycles_are_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_anywhere() -> None:
    assert cycles(import_graph()) == []


def test_the_canvas_maths_imports_no_service_request_or_wire_module() -> None:
    above = ("service.", "request.", "loading.", "shared.protocol", "shared.frames")
    graph = import_graph()
    for module, targets in graph.items():
        if module.startswith("diffgemma_engine.canvas"):
            reached = {target.removeprefix("diffgemma_engine.") for target in targets}
            assert not [target for target in reached if target.startswith(above)], (module, reached)


def test_the_canvas_maths_imports_nothing_from_loading() -> None:
    """Issue 28: the canvas stood on the loader for three one-line helpers; they are ``canvas/runtime.py`` now, and
    the loader imports them from there."""
    graph = import_graph()
    canvas = [module for module in graph if module.startswith("diffgemma_engine.canvas.")]
    assert len(canvas) >= 10, canvas
    for module in canvas:
        reached = {target.removeprefix("diffgemma_engine.") for target in graph[module]}
        assert not [target for target in reached if target.startswith("loading") or target == "errors"], reached
        assert all(target.startswith("diffgemma_engine.canvas") for target in graph[module] if "engine" in target)


def test_the_language_server_imports_only_what_the_engine_shares() -> None:
    """Issue 28: what both processes share is one folder, ``engine/shared/``; the language server's package imports
    nothing else of the engine (its doctor asks the engine's command line for the rest), and the shared folder imports
    nothing from the rest of the engine, so it stays torch-free."""
    graph = import_graph()
    shared = {module for module in graph if module.startswith("diffgemma_engine.shared")}
    assert {"diffgemma_engine.shared.protocol", "diffgemma_engine.shared.prompt"} <= shared, shared
    for module, targets in graph.items():
        engine = {target for target in targets if target.startswith("diffgemma_engine")}
        if module.startswith("diffgemma_lsp"):
            assert engine <= shared, (module, engine - shared)
        if module in shared:
            assert engine <= shared, (module, engine - shared)
    assert any(graph[module] & shared for module in graph if module.startswith("diffgemma_lsp"))


ENGINE_LAYERS = ["service", "runtimes", "request", "loading", "canvas", "vllm"]
"""The engine's layers, top to bottom."""


def test_the_engine_folders_import_downward() -> None:
    """The engine's layers, top to bottom: the service (socket side, model thread), the runtimes that run the
    canvases, the request, loading, the canvas maths, the vLLM runtime's requests; ``shared`` and ``errors`` sit
    under all of them. No layer imports one above it."""
    order = ENGINE_LAYERS
    graph = import_graph()
    for module, targets in graph.items():
        layer = module.split(".")[1] if module.startswith("diffgemma_engine.") else None
        if layer not in order:
            continue
        for target in targets:
            other = target.split(".")[1] if target.startswith("diffgemma_engine.") else None
            if other in order:
                assert order.index(other) >= order.index(layer), (module, target)


FEATURES = "diffgemma_lsp.features"


def test_no_feature_imports_another_and_only_the_server_imports_features() -> None:
    """Issue 44: completion, rewrite and next edit stand side by side over the session; what rewrite and next edit
    share is ``features/selection.py``, which imports no feature either. ``server.py`` is the one module that
    imports ``features/`` (of the language server's package: the benchmarks measure their pure parts)."""
    graph = import_graph()
    features = {module for module in graph if module.startswith(f"{FEATURES}.")}
    assert {f"{FEATURES}.{name}" for name in ("completion", "rewrite", "next_edit", "selection")} <= features
    for module, targets in graph.items():
        reached = {target for target in targets if target.startswith(f"{FEATURES}.")}
        if module in features:
            allowed = {f"{FEATURES}.selection"} if module != f"{FEATURES}.selection" else set()
            assert reached <= allowed, (module, reached - allowed)
        elif module.startswith("diffgemma_lsp") and module not in (FEATURES, "diffgemma_lsp.server"):
            assert not reached and FEATURES not in targets, (module, reached)


def test_the_session_imports_no_feature_and_postprocess_no_repo() -> None:
    """The session is what the features share: it imports none of them (nor the server). The post-processing
    filters read the grammars (``diffgemma_lsp/grammars.py``, below both), never the workspace index's ``repo/``."""
    graph = import_graph()
    for module, targets in graph.items():
        if module in ("diffgemma_lsp.session", "diffgemma_lsp.backend_link", "diffgemma_lsp.owners"):
            assert not [target for target in targets if target.startswith(FEATURES)], module
            assert "diffgemma_lsp.server" not in targets, module
        if module.startswith("diffgemma_lsp.postprocess"):
            assert not [target for target in targets if target.startswith("diffgemma_lsp.repo")], (module, targets)
    assert "diffgemma_lsp.grammars" in graph["diffgemma_lsp.postprocess.syntax"]


def runtime_rule_breaks(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports that break issue 44's seam: the model thread (``service.worker``) and the seam know no runtime of
    their own; a runtime imports no other; only the ``serve`` command (``serve_command``) picks one."""
    prefix = "diffgemma_engine.runtimes."
    runtimes = {module for module in graph if module.startswith(prefix) and module != f"{prefix}seam"}
    breaks = []
    for module, targets in graph.items():
        for target in targets & runtimes:
            if module != "diffgemma_engine.serve_command" and target != module:
                breaks.append((module, target))
    return breaks


def test_the_runtimes_sit_behind_one_seam() -> None:
    """Issue 44: the worker takes a ``CanvasRuntime`` and has no branch on which; the engine's own loop and vLLM are
    one module each, and a third would be one more."""
    graph = import_graph()
    runtimes = {module for module in graph if module.startswith("diffgemma_engine.runtimes.")}
    assert {"diffgemma_engine.runtimes.own_loop", "diffgemma_engine.runtimes.vllm_server"} <= runtimes, runtimes
    assert "diffgemma_engine.runtimes.seam" in graph["diffgemma_engine.service.worker"]
    assert runtime_rule_breaks(graph) == []
    bad = {**graph, "diffgemma_engine.service.worker": {"diffgemma_engine.runtimes.own_loop"}}
    assert runtime_rule_breaks(bad) == [("diffgemma_engine.service.worker", "diffgemma_engine.runtimes.own_loop")]
