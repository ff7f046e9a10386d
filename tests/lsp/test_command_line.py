"""Every command of ``diffgemma-lsp`` and ``diffgemma-engine`` explains itself: ``diffgemma-lsp --help`` lists each
command with its whole synopsis, and the README's "Command line" block gives every option of every command. The
commands are found in the code (each command's parser names its program), not in the table the help is made from,
so a command added without its help fails here."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from diffgemma_engine.__main__ import build_parser as engine_parser
from diffgemma_lsp.__main__ import SUBCOMMANDS, command_parser
from diffgemma_lsp.__main__ import build_parser as server_parser

ROOT = Path(__file__).resolve().parents[2]
OPTION = re.compile(r"(?<![\w-])--?[a-zA-Z][\w-]*")


def programs_in(folder: str, program: str) -> set[str]:
    """The commands whose parsers the code under ``folder`` builds for ``program`` (``prog="program NAME"``, or
    ``add_parser("NAME"`` for the engine's subparsers)."""
    found: set[str] = set()
    for path in (ROOT / folder).rglob("*.py"):
        text = path.read_text()
        found.update(re.findall(rf'prog="{program} (\w+)"', text))
        found.update(re.findall(r'commands\.add_parser\(\s*"(\w+)"', text))
    return found


def options_in(usage: str) -> set[str]:
    """The options a usage line names, help itself aside."""
    return set(OPTION.findall(usage)) - {"-h", "--help"}


def engine_usages() -> dict[str, str]:
    """The engine's subcommands, each with its usage, as its ``--help`` lists them."""
    names = re.search(r"\{([\w,]+)\}", engine_parser().format_usage())
    assert names, engine_parser().format_usage()
    usages = {}
    for name in names.group(1).split(","):
        captured = io.StringIO()
        with contextlib.redirect_stdout(captured), pytest.raises(SystemExit):
            engine_parser().parse_args([name, "--help"])
        usages[name] = captured.getvalue().split("\n\n", 1)[0]
    return usages


def readme_synopses() -> dict[str, str]:
    """The README's "Command line" block: each entry (a line starting with the program, and the indented lines
    after it), by its command (``diffgemma-lsp doctor``; ``diffgemma-lsp`` for the server itself)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Command line", 1)[1].split("```", 2)[1]
    entries: dict[str, str] = {}
    current = ""
    for line in block.splitlines():
        if line.startswith("diffgemma-"):
            words = re.match(r"(diffgemma-\w+)(?: +(\w+))?", line)
            assert words
            current = " ".join(word for word in words.groups() if word)
            entries[current] = entries.get(current, "") + line
        elif line.strip() and current:
            entries[current] += " " + line.strip()
    return entries


def test_the_commands_in_the_code_are_the_ones_the_help_is_made_from() -> None:
    assert programs_in("diffgemma_lsp", "diffgemma-lsp") == set(SUBCOMMANDS)


def test_help_lists_every_command_with_its_whole_synopsis() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "diffgemma_lsp", "--help"], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    for name, (_module, summary) in SUBCOMMANDS.items():
        section = shown.split(f"\n  {name} ", 1)[1].split("\n\n", 1)[0]
        assert summary in section
        assert options_in(command_parser(name).format_usage()) <= set(OPTION.findall(section)), name
    assert options_in(server_parser().format_usage()) <= set(OPTION.findall(shown.split("commands", 1)[0]))


def test_the_readme_gives_every_option_of_every_command() -> None:
    readme = readme_synopses()
    usages = {"diffgemma-lsp": server_parser().format_usage(), "diffgemma-engine": engine_parser().format_usage()}
    usages.update({f"diffgemma-lsp {name}": command_parser(name).format_usage() for name in SUBCOMMANDS})
    usages.update({f"diffgemma-engine {name}": usage for name, usage in engine_usages().items()})
    assert programs_in("engine", "diffgemma-engine") <= {name.split()[-1] for name in usages}
    missing = {
        command: sorted(options_in(usage) - set(OPTION.findall(readme.get(command, ""))) - {"--version"})
        for command, usage in usages.items()
    }
    assert {command: options for command, options in missing.items() if options} == {}


def test_the_readme_says_the_context_position_counts_from_1() -> None:
    text = (ROOT / "README.md").read_text()
    assert "counted from 1" in readme_synopses()["diffgemma-lsp context"] or re.search(
        r"`diffgemma-lsp context[^`]*`[^.]*(1-based|from 1)", text
    )
