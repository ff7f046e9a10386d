"""The installed product: what the wheel holds, and that an install (not the repository) runs both processes.

The folder ``engine/`` installs as ``diffgemma_engine`` (``package-dir`` in pyproject.toml). Auto-discovery does not
follow that mapping, so the packages are listed by hand; the first test keeps the list whole.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from diffgemma_engine.shared import socket_paths
from tests.e2e.test_lsp_engine import _kill_engine
from tests.support.lsp import complete_when_ready, open_document, start_client

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def installed_name(folder: Path) -> str:
    """The package name a source folder installs as, through ``package-dir``."""
    parts = folder.relative_to(ROOT).parts
    for name, source in PYPROJECT.get("package-dir", {}).items():
        if parts[: len(Path(source).parts)] == Path(source).parts:
            return ".".join([name, *parts[len(Path(source).parts) :]])
    return ".".join(parts)


DATA_PACKAGES = {"diffgemma_engine.default_model"}
"""Folders of data, no code, installed as packages whose package data is every file (the shipped model)."""


def test_every_package_folder_is_in_the_packages_list() -> None:
    folders = [path.parent for top in ("diffgemma_lsp", "engine") for path in (ROOT / top).rglob("__init__.py")]
    on_disk = {installed_name(folder) for folder in folders if "__pycache__" not in folder.parts}
    assert on_disk | DATA_PACKAGES == set(PYPROJECT["packages"]), "add the new package to [tool.setuptools] packages"
    assert {name: PYPROJECT["package-data"][name] for name in DATA_PACKAGES} == {name: ["*"] for name in DATA_PACKAGES}


def test_importing_the_folder_by_its_name_is_refused() -> None:
    """From the repository root ``import engine`` would load a second copy of every module: it fails instead."""
    run = subprocess.run([sys.executable, "-c", "import engine"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "import diffgemma_engine, not engine:" in run.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project built as a wheel and installed (without its dependencies) into a folder of its own."""
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (out / "build.log").write_text(build.stdout + build.stderr)
    (wheel,) = out.glob("*.whl")
    target = out / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        timeout=300,
    )
    return target


@pytest.mark.e2e
def test_the_wheel_holds_the_two_packages_and_the_shipped_model(installed: Path) -> None:
    (wheel,) = installed.parent.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"diffgemma_lsp", "diffgemma_engine"}
    shipped = {f"diffgemma_engine/default_model/{path.name}" for path in (ROOT / "engine/default_model").iterdir()}
    assert shipped <= set(names) and "diffgemma_engine/default_model/model.safetensors" in shipped
    # setuptools' boxed warnings (a data folder that "would be ignored") read as "the shipped model is missing"
    build_log = (installed.parent / "build.log").read_text()
    assert "would be ignored" not in build_log and "absent from the `packages`" not in build_log, build_log
    entry_points = next(name for name in names if name.endswith("entry_points.txt"))
    assert "diffgemma-engine = diffgemma_engine.__main__:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


@pytest.mark.e2e
def test_the_installed_engine_answers_from_its_own_files(installed: Path, tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(installed), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import diffgemma_engine, diffgemma_lsp; print(diffgemma_engine.__file__); print(diffgemma_lsp.__file__)",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert all(Path(line).is_relative_to(installed) for line in where.stdout.split()), where.stdout
    run = subprocess.run(
        [sys.executable, str(installed / "bin" / "diffgemma-engine"), "infill", "--steps", "4"],
        input="def add(a, b):\n    return ",
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip(), run.stderr


@pytest.mark.e2e
async def test_the_installed_language_server_starts_the_installed_engine(
    installed: Path, isolated_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(installed))
    monkeypatch.chdir(isolated_env)
    command = [sys.executable, str(installed / "bin" / "diffgemma-lsp"), "--stdio"]
    client = await start_client(command, init_options={"diffgemma": {"debounceMs": 0, "extraContextTokens": 0}})
    try:
        open_document(client, "file:///tmp/add.py", "def add(a, b):\n    return \n")
        result = await complete_when_ready(client, "file:///tmp/add.py", 1, 11)
        assert result.items
    finally:
        await client.shutdown_session()
        # The engine it started outlives it (it serves every window): stopped here, as a user's would idle out.
        _kill_engine(socket_paths.default_socket_path(), signal.SIGTERM)


PYRIGHT = "pyright@1.1.414"
"""Pyright, VS Code's Python language server (Pylance) in its open-source form, pinned."""


def test_static_tools_resolve_both_packages_from_the_editable_install(tmp_path: Path) -> None:
    """``make setup`` installs in setuptools' strict editable mode: a tree of links a ``.pth`` file names, which
    static tools read; the default mode installs an import hook they cannot, and pyright then resolved neither
    ``diffgemma_engine`` (go-to-definition failed across the process boundary) nor ``diffgemma_lsp``."""
    import sysconfig

    import diffgemma_engine

    if Path(diffgemma_engine.__file__).resolve().parent != ROOT / "engine":
        pytest.skip("not an editable install of this checkout")
    site = Path(sysconfig.get_paths()["purelib"])
    entries = [
        Path(line.strip())
        for pth in site.glob("*.pth")
        for line in pth.read_text().splitlines()
        if line.strip() and not line.startswith(("import", "#"))
    ]
    trees = [entry for entry in entries if (entry / "diffgemma_engine" / "__init__.py").is_file()]
    assert trees, f"no .pth path in {site} holds diffgemma_engine: reinstall with make setup"
    tree = trees[0]
    for source in sorted((ROOT / "engine").rglob("*.py")):
        if "__pycache__" not in source.parts:
            linked = tree / "diffgemma_engine" / source.relative_to(ROOT / "engine")
            assert linked.resolve() == source, f"{linked}: a module added since the install? run make setup"
    # The check itself, by pyright, where npm can install it (CI requires it).
    from tests.support.npm import npm_or_skip

    npm = npm_or_skip()
    tools = ROOT / ".cache" / "pyright"
    binary = tools / "node_modules" / ".bin" / "pyright"
    if not binary.exists():
        subprocess.run(
            [npm, "install", "--prefix", str(tools), "--no-audit", "--no-fund", PYRIGHT],
            check=True,
            capture_output=True,
            timeout=300,
        )
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from diffgemma_engine.shared import protocol\nfrom diffgemma_engine.canvas.step import denoise_step\n"
        "from diffgemma_lsp.settings import Settings\nprint(protocol.PROTOCOL_VERSION, denoise_step, Settings)\n"
    )
    run = subprocess.run(
        [str(binary), "--pythonpath", sys.executable, str(probe)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0 and "0 errors" in run.stdout, run.stdout + run.stderr
