"""What the user is told when no next edit appears because the model is not sure (its draws disagree)."""

from __future__ import annotations

from diffgemma_engine.shared import socket_paths

UNSURE_NOTICE_AFTER = 3
"""How many next edits the draws disagreed on, with none suggested in between, before the user is told why none
appears (once per server): the shipped model's draws never agree (``benchmarks/README.md``)."""


def unsure_notice(model_id: str, draws: int) -> str:
    """What the user is told when the model's draws keep disagreeing: why no next edit appears, what would help."""
    shipped = model_id in ("", socket_paths.SHIPPED_MODEL_ID)
    why = (
        "the shipped model is a small test model: it exercises the path, its answers are not useful"
        if shipped
        else "the model is not sure of any edit here"
    )
    return (
        f"diffgemma: no next edit: the model's {draws} draws of the edit disagreed {UNSURE_NOTICE_AFTER} times in a "
        f"row ({why}). A real model makes next edits (the model setting; see the README's Quick start); "
        "nextEditDraws 1 shows an unsure model's edits too."
    )
