"""The VS Code extension (editors/vscode): its settings are the server's, and its own build and unit tests pass."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import attrs
import pytest

from diffgemma_lsp.settings import WIRE_KEYS, Settings, parse_settings

ROOT = Path(__file__).resolve().parents[2]
EXTENSION = ROOT / "editors" / "vscode"
REQUIRE_NODE_ENV = "DIFFGEMMA_REQUIRE_NODE"
EXTENSION_ONLY = {"serverPath": "diffgemma-lsp", "serverArgs": []}
"""Settings the extension uses itself (the server's command line), with their defaults."""
JSON_TYPES = {
    "bool": "boolean",
    "int": "integer",
    "float": "number",
    "str": "string",
    "str | None": ["string", "null"],
    "int | None": ["integer", "null"],
}


def _contributed() -> dict[str, dict]:
    package = json.loads((EXTENSION / "package.json").read_text())
    properties = package["contributes"]["configuration"]["properties"]
    assert all(name.startswith("diffgemma.") for name in properties), list(properties)
    return {name.removeprefix("diffgemma."): schema for name, schema in properties.items()}


def test_contributed_settings_are_exactly_the_servers() -> None:
    contributed = _contributed()
    assert set(contributed) == set(WIRE_KEYS) | set(EXTENSION_ONLY)
    defaults = Settings()
    fields = attrs.fields_dict(Settings)
    for key, name in WIRE_KEYS.items():
        schema = contributed[key]
        default = getattr(defaults, name)
        # Compare as JSON, so that True and 1 (or 0 and False) are not taken for each other.
        assert json.dumps(schema["default"]) == json.dumps(default), key
        assert schema["type"] == JSON_TYPES[str(fields[name].type)], key
        assert schema.get("description") or schema.get("markdownDescription"), f"{key} has no description"
    for key, default in EXTENSION_ONLY.items():
        assert contributed[key]["default"] == default, key
        assert contributed[key].get("description") or contributed[key].get("markdownDescription"), key
    for key in WIRE_KEYS:
        # A setting offered as a list of choices: the server takes each choice, and refuses others.
        if choices := contributed[key].get("enum"):
            for choice in choices:
                assert parse_settings({key: choice})[1] == [], (key, choice)
            assert parse_settings({key: "not-a-choice"})[1], f"the server takes any {key}: drop the enum"
    # What the extension sends by default is what the server takes without a complaint.
    sent = {key: contributed[key]["default"] for key in WIRE_KEYS}
    assert parse_settings({"diffgemma": sent}) == (defaults, [])


def npm_or_skip() -> str:
    """npm's path; skips without it, unless DIFFGEMMA_REQUIRE_NODE=1 makes that a failure."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        why = "node/npm are not on PATH (Node 20+ builds and tests editors/vscode)"
        if os.environ.get(REQUIRE_NODE_ENV) == "1":
            pytest.fail(f"{why}, and {REQUIRE_NODE_ENV}=1 requires them")
        pytest.skip(f"{why}; set {REQUIRE_NODE_ENV}=1 to fail instead")
    return npm


def run_npm(npm: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``npm ARGS`` in editors/vscode; fails the test with its output when it fails."""
    env = dict(os.environ, PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD="1", NO_UPDATE_NOTIFIER="1")
    proc = subprocess.run(
        [npm, *args],
        cwd=EXTENSION,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, f"npm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def ensure_node_modules(npm: str) -> None:
    """``npm ci`` when node_modules is missing or older than package-lock.json."""
    modules = EXTENSION / "node_modules"
    lock = EXTENSION / "package-lock.json"
    if not modules.is_dir() or modules.stat().st_mtime < lock.stat().st_mtime:
        run_npm(npm, "ci", "--no-audit", "--no-fund", timeout=600)
        modules.touch()


def test_npm_compile_and_unit_tests_pass() -> None:
    """tsc (strict) compiles the extension and its node --test unit tests (mocked vscode) pass."""
    npm = npm_or_skip()
    ensure_node_modules(npm)
    run_npm(npm, "run", "compile")
    proc = run_npm(npm, "test")
    counts = dict(re.findall(r"^# (pass|fail) (\d+)$", proc.stdout, flags=re.MULTILINE))
    assert counts.get("fail") == "0", proc.stdout
    assert int(counts.get("pass", "0")) > 0, proc.stdout


def test_a_repository_cannot_choose_where_code_goes_or_what_loads() -> None:
    """Settings that send code or a secret elsewhere, or pick what the engine loads, are the user's own: machine
    scope (never from a workspace's .vscode/settings.json) and restricted in untrusted workspaces."""
    package = json.loads((EXTENSION / "package.json").read_text())
    restricted = set(package["capabilities"]["untrustedWorkspaces"]["restrictedConfigurations"])
    contributed = _contributed()
    for key in ("model", "backend", "openaiUrl", "openaiModel", "openaiApiKeyEnv"):
        assert contributed[key].get("scope") == "machine", key
        assert f"diffgemma.{key}" in restricted, key
    assert {"diffgemma.serverPath", "diffgemma.serverArgs"} <= restricted
    assert "/tmp/" not in json.dumps(package)  # no example path another user could own
