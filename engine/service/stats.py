"""What the engine has answered lately, for ``diffgemma-lsp doctor`` and for memory checks."""

from __future__ import annotations

import collections
import statistics
import time
from pathlib import Path

from ..shared import protocol

RECENT = 200


def rss_mb() -> float:
    """This process's resident memory in MiB (Linux), or 0 where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class ReplyLog:
    """Counts replies by outcome and keeps the latest engine times."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.counts: collections.Counter[str] = collections.Counter()
        self.recent_ms: collections.deque[float] = collections.deque(maxlen=RECENT)
        self.recent_step_ms: collections.deque[float] = collections.deque(maxlen=RECENT)
        """Denoising time per step of the same requests."""
        self.last_error = ""

    def record(self, reply: protocol.Result | protocol.Error) -> None:
        """Note one reply."""
        if isinstance(reply, protocol.Result):
            self.counts[reply.stop.value] += 1
            timings = reply.timings
            if reply.stop in (protocol.StopReason.EOS, protocol.StopReason.LENGTH, protocol.StopReason.DEADLINE):
                self.recent_ms.append(timings.total_ms)
                if timings.steps:
                    self.recent_step_ms.append(timings.denoise_ms / timings.steps)
        else:
            self.counts[reply.code.value] += 1
            self.last_error = f"{reply.code.value}: {reply.message}"

    def percentile(self, fraction: float) -> float:
        """A percentile of the recent engine times (0 when there are none)."""
        return _percentile(self.recent_ms, fraction)

    def step_percentile(self, fraction: float) -> float:
        """A percentile of the recent times per denoising step (0 when there are none)."""
        return _percentile(self.recent_step_ms, fraction)


def _percentile(values: collections.deque[float], fraction: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(fraction * 100) - 1]
