"""A setting is declared once, in ``diffgemma_lsp.settings.Settings``; every place that lists settings for a user
is checked against it here (issue 28): the README's table (names and defaults), the VS Code extension's choices,
the lists in the VS Code README and the Neovim config, and the keys the editors' READMEs show in examples. The
VS Code ``package.json`` contributions are checked in ``test_vscode_extension.py``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs
import pytest

from diffgemma_lsp.fim_formats import ALIASES
from diffgemma_lsp.settings import WIRE_KEYS, Settings

ROOT = Path(__file__).resolve().parents[2]
EDITORS = ROOT / "editors"
EDITOR_ONLY = {"serverPath", "serverArgs"}
"""The VS Code extension's own settings: how it starts the server."""


def _readme_table() -> dict[str, str]:
    """key -> the default column of the README's settings table."""
    rows = re.findall(r"^\| `(\w+)` \| (.*?) \|", (ROOT / "README.md").read_text(), flags=re.MULTILINE)
    return dict(rows)


def test_the_readme_table_lists_every_setting_once_with_its_default() -> None:
    table = _readme_table()
    assert sorted(table) == sorted(WIRE_KEYS)
    defaults = Settings()
    for key, name in WIRE_KEYS.items():
        default = getattr(defaults, name)
        shown = table[key]
        if default is None and not shown.startswith("`"):  # described in words: "shipped model"
            continue
        assert shown == f"`{json.dumps(default)}`", (key, shown, default)


def _listed(text: str) -> set[str]:
    return set(re.findall(r"\b[a-z]+(?:[A-Z][a-z]+)*\b", text)) & (set(WIRE_KEYS) | EDITOR_ONLY | {"enable"})


def test_the_vscode_readme_lists_every_setting() -> None:
    text = (EDITORS / "vscode" / "README.md").read_text()
    section = text.split("## Settings", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`(\w+)`", section.split("top-level README.md:", 1)[1].split(". ", 1)[0]))
    assert listed == set(WIRE_KEYS)


def test_the_neovim_config_lists_every_setting() -> None:
    comment = "".join(
        line.removeprefix("--")
        for line in (EDITORS / "neovim" / "lsp" / "diffgemma.lua").read_text().splitlines()
        if line.startswith("--")
    )
    named = comment.split("README's table:", 1)[1]
    listed = {word.strip(" .\n") for word in named.split(",")}
    assert listed == set(WIRE_KEYS)


@pytest.mark.parametrize("editor", sorted(path.parent.name for path in EDITORS.glob("*/README.md")))
def test_editor_readmes_name_only_real_settings(editor: str) -> None:
    """A key set in an example (``key = value`` or ``"key": value``) is a setting the server knows."""
    readme = EDITORS / editor / "README.md"
    found = set(re.findall(r'"?\b([a-z]+[A-Z][A-Za-z]*)\b"?\s*[=:]', readme.read_text()))
    assert found, f"{editor}: no setting example found"
    assert found <= set(WIRE_KEYS) | EDITOR_ONLY, sorted(found - set(WIRE_KEYS) - EDITOR_ONLY)


def test_the_vscode_choices_are_the_servers() -> None:
    """A setting the server takes from a list offers exactly that list in VS Code (the quantizations: one list,
    ``protocol.QUANTIZATION_CHOICES``), less some of the prompt formats' other names."""
    package = json.loads((EDITORS / "vscode" / "package.json").read_text())
    properties = package["contributes"]["configuration"]["properties"]
    checked = 0
    for field in attrs.fields(Settings):
        validator = field.validator
        options = getattr(validator, "options", None)
        if options is None:
            continue
        key = next(key for key, name in WIRE_KEYS.items() if name == field.name)
        offered = properties[f"diffgemma.{key}"].get("enum")
        assert offered is not None and set(offered) <= set(options), key
        assert set(options) - set(offered) <= set(ALIASES), (key, "not offered:", set(options) - set(offered))
        checked += 1
    assert checked >= 2
