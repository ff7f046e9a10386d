"""When an engine without clients exits: after a given time, never, or (``auto``) after a time that follows what
reloading its model would cost, which the engine knows once it has loaded it. Pure: no torch, no socket."""

from __future__ import annotations

import argparse

AUTO = "auto"
QUICK_LOAD_S = 10.0
"""A model that loads in this long or less is cheap to load again (the shipped one takes about a second)."""
QUICK_IDLE_S = 15 * 60.0
"""``auto`` for a model that loads quickly: its memory is given back after 15 minutes without clients."""
SLOW_IDLE_S = 8 * 3600.0
"""``auto`` for a slower one (the release's 48 GiB take minutes): a working day, so that closing the editor over
lunch does not cost the next keystroke a reload."""


def parse_idle_exit(text: str) -> float | None:
    """``--idle-exit``: seconds without clients (0: never), or ``auto`` (None: decided once the model has loaded)."""
    if text == AUTO:
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (0: never) or {AUTO}, got {text!r}") from None
    if not seconds >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"expected 0 or more seconds, got {text!r}")
    return seconds


def idle_exit_after(load_ms: float) -> float:
    """``auto``'s idle exit for a model that took ``load_ms`` to load: ``QUICK_IDLE_S`` or ``SLOW_IDLE_S``."""
    return QUICK_IDLE_S if load_ms <= QUICK_LOAD_S * 1000 else SLOW_IDLE_S
