"""Sizes and counts in units that fit them, for reports a person reads (``plan``, ``doctor``): the shipped
model's 10 MB and the release's 48 GiB both read as numbers, not as ``0.0 GiB``. Pure, standard library only."""

from __future__ import annotations

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30


def size_text(count: float) -> str:
    """``count`` bytes in GiB, MiB, KiB or bytes, whichever is the largest that is at least 1."""
    if count >= GIB:
        return f"{count / GIB:.1f} GiB"
    if count >= MIB:
        return f"{count / MIB:.0f} MiB"
    if count >= KIB:
        return f"{count / KIB:.1f} KiB"
    return f"{count:.0f} bytes"


def count_text(count: float) -> str:
    """A number of parameters in billions (B), millions (M) or thousands (K), as model sizes are written."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= scale:
            return f"{count / scale:.2f} {unit}"
    return f"{count:.0f}"
