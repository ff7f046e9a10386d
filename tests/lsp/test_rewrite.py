"""A rewrite's pure parts: the command's argument, the code action, the selection and the request built from it,
the replacement's post-processing (golden cases in tests/data/golden/rewrite/), the edit, and what each backend
makes of a rewrite."""

from __future__ import annotations

import tomllib
from pathlib import Path

import attrs
import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams

from diffgemma_engine.shared import protocol
from diffgemma_lsp.backends.base import OLD_ENGINE, RewriteUnsupported
from diffgemma_lsp.backends.local import EngineClient
from diffgemma_lsp.backends.remote import OpenAIBackend
from diffgemma_lsp.document import LineDocument
from diffgemma_lsp.features.rewrite import KIND, REWRITE_COMMAND, TITLE, code_action, parse_arguments, replacement_edit
from diffgemma_lsp.features.selection import build_request, computed_on, read_selection
from diffgemma_lsp.params import MAX_MESSAGE_CHARS
from diffgemma_lsp.postprocess import postprocess, postprocess_replacement
from diffgemma_lsp.postprocess.replacement import CUTS, cuts_passed_by
from diffgemma_lsp.settings import Settings

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden" / "rewrite"
URI = "file:///work/add.py"
SOURCE = "def add(a, b):\n    total = a - b\n    return total\n\nprint(add(1, 2))\n"
WRONG = types.Range(start=types.Position(line=1, character=0), end=types.Position(line=2, character=16))
"""The two lines of the function's body, without the line break after them."""


def _range(a: int, b: int, c: int, d: int) -> types.Range:
    return types.Range(start=types.Position(line=a, character=b), end=types.Position(line=c, character=d))


def _document(text: str = SOURCE, version: int = 7) -> LineDocument:
    return LineDocument(URI, text, version=version, language_id="python")


def _argument(**changes: object) -> dict[str, object]:
    argument: dict[str, object] = {
        "uri": URI,
        "range": {"start": {"line": 1, "character": 0}, "end": {"line": 2, "character": 16}},
        "version": 7,
    }
    argument.update(changes)
    return argument


# --- the command's argument ----------------------------------------------------------------------------------


def test_the_argument_object_is_read() -> None:
    read = parse_arguments([_argument(instruction="use a plus")])
    assert (read.uri, read.range, read.version, read.instruction) == (URI, WRONG, 7, "use a plus")
    assert parse_arguments([_argument()]).instruction == ""


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "one argument object"),
        ([_argument(), _argument()], "one argument object"),
        (["file:///work/add.py"], "one argument object"),
        ([_argument(uri=None)], "uri"),
        ([_argument(uri="")], "uri"),
        ([_argument(range=[1, 0, 2, 16])], "range must be an LSP range"),
        ([_argument(range={"start": {"line": 1, "character": 0}})], "range.end"),
        ([_argument(range={"start": {"line": 1, "character": -1}, "end": {"line": 2, "character": 0}})], "range.start"),
        (
            [_argument(range={"start": {"line": True, "character": 0}, "end": {"line": 2, "character": 0}})],
            "range.start",
        ),
        (  # LSP's positions are uintegers: up to 2**31 - 1 (lsprotocol refuses more, as an internal error)
            [_argument(range={"start": {"line": 2**31, "character": 0}, "end": {"line": 2, "character": 0}})],
            "range.start needs a line and a character, both integers from 0 to 2147483647",
        ),
        (
            [_argument(range={"start": {"line": 1, "character": 0}, "end": {"line": 2, "character": 2**63}})],
            "range.end",
        ),
        (
            [_argument(range={"start": {"line": 1.0, "character": 0}, "end": {"line": 2, "character": 0}})],
            "range.start",
        ),
        ([_argument(range={"start": {"line": 1, "character": 0}, "end": {"line": -2, "character": 0}})], "range.end"),
        ([_argument(version=2**31)], "version must be the document's version .an integer from -2147483648"),
        ([_argument(version=-(2**31) - 1)], "version"),
        ([_argument(version=7.0)], "version"),
        ([_argument(version="7")], "version"),
        ([_argument(version=True)], "version"),
        ([_argument(version=None)], "version"),
        ([_argument(instruction=3)], "instruction"),
        ([_argument(instruction="x" * (protocol.MAX_INSTRUCTION_CHARS + 1))], "shorten it"),
    ],
)
def test_a_bad_argument_is_invalid_params_naming_what_is_wrong(args: list[object], says: str) -> None:
    with pytest.raises(JsonRpcInvalidParams, match=says) as caught:
        parse_arguments(args)
    assert caught.value.code == -32602
    assert REWRITE_COMMAND in str(caught.value)


def test_an_error_quotes_a_huge_argument_only_in_part() -> None:
    with pytest.raises(JsonRpcInvalidParams, match="uri must be") as caught:
        parse_arguments([_argument(uri=["x" * 5_000_000])])
    assert len(str(caught.value)) <= len(REWRITE_COMMAND) + 2 + MAX_MESSAGE_CHARS


# --- the code action -----------------------------------------------------------------------------------------


def _action_params(selected: types.Range, only: list[str] | None = None) -> types.CodeActionParams:
    return types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=URI),
        range=selected,
        context=types.CodeActionContext(diagnostics=[], only=only),
    )


def test_a_selection_gets_the_rewrite_action_with_the_commands_argument() -> None:
    action = code_action(Settings(), _document(), _action_params(WRONG))
    assert action is not None
    assert (action.title, action.kind) == (TITLE, KIND) == ("Rewrite selection", "refactor.rewrite")
    assert action.command is not None and action.command.command == REWRITE_COMMAND
    assert action.command.arguments == [_argument()]
    assert parse_arguments(action.command.arguments).range == WRONG  # what it offers, the command takes


def test_no_action_for_an_empty_selection_when_disabled_or_filtered_out() -> None:
    assert code_action(Settings(), _document(), _action_params(_range(1, 4, 1, 4))) is None
    assert code_action(Settings(), _document(), _action_params(_range(1, 99, 1, 30))) is None  # both clamp to 1:17
    assert code_action(Settings(rewrite_enabled=False), _document(), _action_params(WRONG)) is None
    assert code_action(Settings(), None, _action_params(WRONG)) is None  # not open
    assert code_action(Settings(), _document(), _action_params(_range(40, 0, 41, 0))) is None
    assert code_action(Settings(), _document(), _action_params(WRONG, only=["quickfix"])) is None
    for kind in ("refactor", "refactor.rewrite", ""):
        assert code_action(Settings(), _document(), _action_params(WRONG, only=[kind])) is not None, kind


# --- the selection and the request ---------------------------------------------------------------------------


def test_the_selection_splits_the_document_in_three() -> None:
    selection = read_selection(_document(), WRONG, 1024)
    assert selection.prefix == "def add(a, b):\n"
    assert selection.text == "    total = a - b\n    return total"
    assert selection.suffix == "\n\nprint(add(1, 2))\n"
    assert (selection.version, selection.language_id, selection.range) == (7, "python", WRONG)


def test_selection_positions_are_utf16_and_clamped_to_the_line() -> None:
    document = _document("s = '😀' + x\nt = 1\n")
    selection = read_selection(document, _range(0, 11, 0, 99), 1024)  # the emoji is two units: 11 is before "x"
    assert (selection.prefix, selection.text, selection.suffix) == ("s = '😀' + ", "x", "\nt = 1\n")
    assert selection.range == _range(0, 11, 0, 12)  # the end as it is in the document


@pytest.mark.parametrize(
    ("selected", "read", "text"),
    [
        (_range(0, 6, 0, 11), _range(0, 7, 0, 11), "' + "),  # the start between the emoji's units: after it
        (_range(0, 0, 0, 6), _range(0, 0, 0, 7), "s = '😀"),  # the end between them: after it, the emoji read
        (_range(0, 6, 1, 0), _range(0, 7, 1, 0), "' + x\n"),
    ],
)
def test_a_selection_edge_inside_a_character_is_the_range_of_the_text_read(
    selected: types.Range, read: types.Range, text: str
) -> None:
    """An edge between the two UTF-16 units of an emoji: the selection is the text read, from the end of the
    emoji, and its range says so (the client's range would leave a lone surrogate in the document)."""
    selection = read_selection(_document("s = '😀' + x\nt = 1\n"), selected, 1024)
    assert (selection.range, selection.text) == (read, text)
    edit = replacement_edit(selection, "y", versioned=False)
    assert edit.changes == {URI: [types.TextEdit(range=read, new_text="y")]}


@pytest.mark.parametrize(
    ("selected", "says"),
    [
        (_range(1, 4, 1, 4), "empty"),
        (_range(2, 0, 1, 0), "ends before it starts"),
        (_range(1, 0, 40, 0), "not in the document"),
        (_range(1, 30, 1, 40), "empty"),  # both clamp to the end of line 1
    ],
)
def test_a_selection_that_is_not_one_is_invalid_params(selected: types.Range, says: str) -> None:
    with pytest.raises(JsonRpcInvalidParams, match=says):
        read_selection(_document(), selected, 1024)


def test_the_context_around_the_selection_is_cut_to_the_budget() -> None:
    body = "".join(f"x{i} = {i}\n" for i in range(2000))
    document = _document(body + "y = 1\n" + body)
    selection = read_selection(document, _range(2000, 0, 2000, 5), 100)  # 400 characters: 300 before, 100 after
    assert selection.text == "y = 1"
    assert 0 < len(selection.prefix) <= 300 and 0 < len(selection.suffix) <= 100
    assert (body + "y = 1").endswith(selection.prefix + "y = 1")


def test_the_request_starts_from_the_selection_with_the_rewrite_settings() -> None:
    selection = read_selection(_document(), WRONG, 1024)
    settings = Settings(rewrite_strength=0.3, rewrite_steps=12, canvas_length=64, steps=40, deadline_ms=500)
    chunks = [protocol.Chunk(filename="helpers.py", text="def helper(): ...\n")]
    request = build_request(selection, settings, "use a plus", chunks, "9")
    assert request.start == [protocol.StartSegment(text="    total = a - b\n    return total", keep=False)]
    assert (request.prefix, request.suffix) == (selection.prefix, selection.suffix)
    assert (request.strength, request.max_steps, request.canvas_length) == (0.3, 12, 64)  # not the completion steps
    assert (request.instruction, request.language_id, request.doc_version) == ("use a plus", "python", 7)
    assert (request.id, request.uri, request.extra, request.candidates) == ("9", URI, chunks, 1)
    assert request.deadline_ms == 0  # the user waits for it, and can cancel


# --- the replacement -----------------------------------------------------------------------------------------


def _golden() -> list[dict[str, object]]:
    cases = []
    for path in sorted(GOLDEN.glob("*.toml")):
        cases += [{"file": path.stem, **case} for case in tomllib.loads(path.read_text(encoding="utf-8"))["case"]]
    return cases


CASES = _golden()


@pytest.mark.parametrize("case", CASES, ids=[str(case["name"]) for case in CASES])
def test_golden_replacement(case: dict[str, object]) -> None:
    source, expected = str(case["source"]), str(case["expected"])
    if case.get("crlf"):
        source, expected = source.replace("\n", "\r\n"), expected.replace("\n", "\r\n")
    assert source.count("├") == source.count("┤") == 1, "a golden source marks one selection: ├ then ┤"
    prefix, rest = source.split("├")
    selection, suffix = rest.split("┤")
    language = str(case.get("language", "python"))
    got = postprocess_replacement(
        prefix, selection, suffix, str(case["raw"]), language, instruct=bool(case.get("instruct", False))
    )
    assert got == (expected or None)


def test_golden_replacements_cover_the_adaptations() -> None:
    names = " ".join(str(case["name"]) for case in CASES)
    assert len(CASES) >= 15
    for topic in ("indentation", "line break", "function", "string", "closer", "CRLF", "tabs", "instruction"):
        assert topic in names, topic


def test_a_cut_the_selection_itself_gets_does_not_apply() -> None:
    """Inside ``f``, an insertion ends with ``f``; a selection that runs on into ``g`` says the replacement may too."""
    prefix, selection, suffix = "def f():\n", "    return 1\n\ndef g():\n    return 2", "\n"
    insertion = postprocess(prefix, suffix, selection, "python")
    assert insertion is not None and insertion.text == "    return 1"  # the cut an insertion gets
    passed = cuts_passed_by(selection, prefix, suffix, "python")
    assert [cut.__name__ for cut in CUTS if cut not in passed] == ["limit_scope"]
    assert cuts_passed_by("    return 1", prefix, suffix, "python") == list(CUTS)


def test_a_blank_selection_is_filled_as_an_insertion() -> None:
    assert postprocess_replacement("def f():\n", "    ", "\n", "    return 1\n", "python") == "    return 1"


# --- the edit ------------------------------------------------------------------------------------------------


def test_the_edit_replaces_exactly_the_selection_at_its_version() -> None:
    selection = read_selection(_document(), WRONG, 1024)
    edit = replacement_edit(selection, "    total = a + b\n    return total", versioned=True)
    assert edit.changes is None and edit.document_changes is not None and len(edit.document_changes) == 1
    change = edit.document_changes[0]
    assert isinstance(change, types.TextDocumentEdit)
    assert (change.text_document.uri, change.text_document.version) == (URI, 7)
    assert change.edits == [types.TextEdit(range=WRONG, new_text="    total = a + b\n    return total")]
    plain = replacement_edit(selection, "x", versioned=False)
    assert plain.document_changes is None and plain.changes == {URI: [types.TextEdit(range=WRONG, new_text="x")]}


def test_the_edit_is_only_for_the_text_it_was_computed_from() -> None:
    """The same version of the document is not enough: a document opened again starts its versions anew."""
    document = _document()
    selection = read_selection(document, WRONG, 1024)
    assert computed_on(selection, document)
    assert computed_on(selection, _document())  # opened again with the same text, at the same version
    assert not computed_on(selection, _document(SOURCE.replace("a - b", "a * b")))  # other text, "version 7"
    assert not computed_on(selection, _document(version=8))
    assert not computed_on(selection, None)  # closed
    changed = _document()
    selection = read_selection(changed, WRONG, 1024)
    change = types.TextDocumentContentChangePartial(range=_range(0, 0, 0, 0), text="# typed\n")
    changed.apply_change(change)  # a change that left the version as it was
    assert changed.version == selection.version and not computed_on(selection, changed)


# --- the backends --------------------------------------------------------------------------------------------


def _rewrite_request() -> protocol.Infill:
    selection = read_selection(_document(), WRONG, 1024)
    return build_request(selection, Settings(), "use a plus", [], "1")


def test_the_engine_is_asked_only_when_its_handshake_lists_rewrites(tmp_path: Path) -> None:
    client = EngineClient(tmp_path / "engine.sock")
    request = _rewrite_request()
    assert client.as_rewrite(request) is request  # before the handshake: infill says the engine is not ready
    client.hello = protocol.HelloOk(protocol=protocol.PROTOCOL_VERSION, model_id="m", ready=True)
    with pytest.raises(RewriteUnsupported) as caught:
        client.as_rewrite(request)
    assert str(caught.value) == OLD_ENGINE
    assert "predates rewrites: restart it (diffgemma-lsp doctor)" in OLD_ENGINE
    client.hello = protocol.HelloOk(
        protocol=protocol.PROTOCOL_VERSION, model_id="m", ready=True, features=[protocol.REWRITE_FEATURE]
    )
    assert client.as_rewrite(request) is request


def test_the_engine_is_not_sent_a_selection_it_would_refuse_as_too_long(tmp_path: Path) -> None:
    """The engine refuses a selection of more characters than its canvas could hold at 32 a token before it
    tokenizes it (``protocol.max_start_chars``): the language server refuses it before sending it, saying so."""
    client = EngineClient(tmp_path / "engine.sock")
    huge = attrs.evolve(_rewrite_request(), start=[protocol.StartSegment(text="x = 1\n" * 900_000)])  # 5.4 MB
    with pytest.raises(RewriteUnsupported, match=r"the selection is 5400000 characters, .*512 tokens .*select less"):
        client.as_rewrite(huge)  # before the handshake: the largest canvas the engine takes
    client.hello = protocol.HelloOk(
        protocol=protocol.PROTOCOL_VERSION, model_id="m", ready=True, canvas_length=64, features=["rewrite"]
    )
    limit = protocol.max_start_chars(64)
    assert limit == 64 * 32
    fits = attrs.evolve(huge, start=[protocol.StartSegment(text="x" * limit)])
    assert client.as_rewrite(fits) is fits  # may still be too many tokens: the engine says so
    with pytest.raises(RewriteUnsupported, match=rf"{limit + 1} characters, more than one canvas of 64 tokens"):
        client.as_rewrite(attrs.evolve(fits, start=[protocol.StartSegment(text="x" * (limit + 1))]))
    longer = attrs.evolve(fits, canvas_length=128, start=[protocol.StartSegment(text="x" * (limit + 1))])
    assert client.as_rewrite(longer) is longer  # the request's own canvas


def test_the_remote_backend_refills_the_span_from_noise() -> None:
    backend = OpenAIBackend("http://127.0.0.1:1/v1/completions")
    request = _rewrite_request()
    sent = backend.as_rewrite(request)
    assert (sent.start, sent.strength, sent.instruction) == ([], 1.0, "")
    assert (sent.prefix, sent.suffix, sent.id) == (request.prefix, request.suffix, request.id)
    body = backend.request_body(sent)
    assert (body["prompt"], body["suffix"]) == (request.prefix, request.suffix)


def test_the_remote_chat_backend_sends_the_selection_and_the_instruction() -> None:
    backend = OpenAIBackend("http://127.0.0.1:1/v1/chat/completions", prompt_format="chat")
    request = _rewrite_request()
    assert backend.as_rewrite(request) is request
    [message] = backend.request_body(request)["messages"]
    assert "use a plus" in message["content"]
    assert "<SELECTION>    total = a - b\n    return total</SELECTION>" in message["content"]


def test_the_remote_chat_backend_does_not_refine_a_suggestion() -> None:
    """A chat completions API cannot start a canvas from the shown text: a refine is not sent there (the completion
    asks anew, from noise)."""
    backend = OpenAIBackend("http://127.0.0.1:1/v1/chat/completions", prompt_format="chat")
    with pytest.raises(RewriteUnsupported, match="shown suggestion"):
        backend.as_rewrite(attrs.evolve(_rewrite_request(), refine=True))


def test_the_doctor_says_whether_the_engine_rewrites() -> None:
    from diffgemma_lsp.doctor import render

    base: dict[str, object] = {"socket": "/run/engine.sock"}
    assert "features        rewrite\n" in render({**base, "features": [protocol.REWRITE_FEATURE]})
    assert "predates rewrites; stop it" in render({**base, "features": []})
    assert "features" not in render(base)  # unreachable: nothing to say
