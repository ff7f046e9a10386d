"""The test checkpoints' cache (tests/conftest.py ``CHECKPOINT_SOURCES``): each is trained again when what it is
built from changes, and only then."""

from __future__ import annotations

import attrs
import pytest

import tests.support.next_edits
from tests.conftest import CHECKPOINT_SOURCES, ROOT, _checkpoint_path


def test_every_source_of_a_checkpoint_is_a_file_of_the_checkout() -> None:
    missing = [
        (name, path) for name, paths in CHECKPOINT_SOURCES.items() for path in paths if not (ROOT / path).is_file()
    ]
    assert missing == []


def test_the_next_edit_checkpoint_follows_the_requests_the_server_sends(monkeypatch: pytest.MonkeyPatch) -> None:
    """A change to what the language server asks for the next edit trains the next-edit checkpoint again (whichever
    file made it), and no other."""
    before = {name: _checkpoint_path(name) for name in CHECKPOINT_SOURCES}
    requests = tests.support.next_edits.next_edit_requests

    def changed(uri: str) -> list[object]:
        return [attrs.evolve(request, prefix="# another line\n" + request.prefix) for request in requests(uri)]

    monkeypatch.setattr(tests.support.next_edits, "next_edit_requests", changed)
    after = {name: _checkpoint_path(name) for name in CHECKPOINT_SOURCES}
    assert after["next-edit"] != before["next-edit"]
    assert {name: path for name, path in after.items() if name != "next-edit"} == {
        name: path for name, path in before.items() if name != "next-edit"
    }
