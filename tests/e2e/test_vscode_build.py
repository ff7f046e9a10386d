"""The VS Code extension's own build (tsc, strict) and unit tests (node --test, vscode mocked): with the editor
tests, not in the lightest layer, as the first ``npm ci`` takes half a minute or more."""

from __future__ import annotations

import re

import pytest

from tests.support.npm import ensure_node_modules, npm_or_skip, run_npm

pytestmark = pytest.mark.e2e


def test_npm_compile_and_unit_tests_pass() -> None:
    """tsc (strict) compiles the extension and its node --test unit tests (mocked vscode) pass."""
    npm = npm_or_skip()
    ensure_node_modules(npm)
    run_npm(npm, "run", "compile")
    proc = run_npm(npm, "test")
    counts = dict(re.findall(r"^# (pass|fail) (\d+)$", proc.stdout, flags=re.MULTILINE))
    assert counts.get("fail") == "0", proc.stdout
    assert int(counts.get("pass", "0")) > 0, proc.stdout
