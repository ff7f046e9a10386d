"""The canvas ``diffgemma-lsp openai`` asks the engine for: a FIM checkpoint's shrinks to a client's ``max_tokens``;
a chat checkpoint's is always the model's own (Zed asks for 64 where the release's is 256, and the fence and the
chat answer's wrapping take tokens the client does not count), and ``max_tokens`` bounds the text returned."""

from __future__ import annotations

from diffgemma_engine.shared import protocol
from diffgemma_lsp.endpoint.server import canvas_for
from diffgemma_lsp.endpoint.wire import cut_to_tokens


def test_a_chat_checkpoints_canvas_is_its_own_whatever_max_tokens_asks() -> None:
    assert canvas_for(64, 256, protocol.Layout.CHAT) == 0  # 0: the model's own
    assert canvas_for(8, 256, protocol.Layout.CHAT) == 0
    assert canvas_for(None, 256, protocol.Layout.CHAT) == 0


def test_a_fim_checkpoints_canvas_follows_max_tokens_up_to_its_own() -> None:
    assert canvas_for(8, 32, protocol.Layout.FIM) == 8
    assert canvas_for(64, 32, protocol.Layout.FIM) == 0
    assert canvas_for(None, 32, protocol.Layout.FIM) == 0


def test_max_tokens_bounds_a_chat_answer_at_a_line_end() -> None:
    text = "    total = a + b\n    return total\n"
    assert cut_to_tokens(text, None) == (text, False)
    assert cut_to_tokens(text, 100) == (text, False)
    assert cut_to_tokens(text, 6) == ("    total = a + b", True)  # 24 characters hold the first line only
    assert cut_to_tokens(text, 1) == ("    total = a + b", True)  # never less than the first line
    assert cut_to_tokens("x" * 50, 2) == ("x" * 50, False)  # one line: nothing to cut at
