"""How fast this machine is right now, written beside each benchmark's figures so runs can be compared.

The same VM measures differently from one hour to the next (other tenants, the hypervisor; benchmarks/README.md
has the spread seen). Each timing benchmark therefore records, before it starts, the median time of a fixed piece
of the engine's own work: the shipped model's vocabulary projection for a 32-token canvas, a (32 x 128) @ (128 x
8192) float32 matmul plus the soft-cap tanh, on one thread. A figure measured with ``reference_ms`` 20% above
another run's is expected to be about that much slower.
"""

from __future__ import annotations

import os
import platform
import statistics
import time

import torch


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued work, so that a clock read after it counts it (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def machine_report(repeats: int = 200) -> dict[str, object]:
    """``reference_ms`` (median of ``repeats``), the load average, the CPU count and torch's thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generator = torch.Generator().manual_seed(0)
        hidden = torch.randn(32, 128, generator=generator)
        weight = torch.randn(8192, 128, generator=generator)
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            torch.tanh(hidden @ weight.T / 30.0)
            samples.append((time.perf_counter() - start) * 1000)
    finally:
        torch.set_num_threads(threads)
    return {
        "reference_ms": round(statistics.median(samples[repeats // 10 :]), 3),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "torch_threads": threads,
        "platform": f"{platform.system()} {platform.machine()}",
    }
