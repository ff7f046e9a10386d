"""Which operators a piece of torch code runs, and which of them make the host wait for the device.

A ``TorchDispatchMode`` sees every ATen operator as it is dispatched, on any device: on a CPU it tells which
operators a GPU run would stop the host at, without a GPU. ``Tensor.tolist()`` reads a CPU tensor's memory without
dispatching anything: compiling with ``fullgraph=True`` catches it instead (``tests/engine/test_static_step.py``).
"""

from __future__ import annotations

import collections
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HOST_SYNC = frozenset(
    {
        "aten._local_scalar_dense.default",  # int(), float() of a tensor
        "aten.item.default",
        "aten.is_nonzero.default",  # bool() of a tensor
        "aten.equal.default",
        "aten.nonzero.default",  # the output's size is the data's
        "aten.nonzero_numpy.default",  # nonzero(as_tuple=True)
        "aten.masked_select.default",
        "aten._unique2.default",
        "aten.unique_dim.default",
        "aten.unique_consecutive.default",
        "aten.bincount.default",
        "aten.repeat_interleave.Tensor",  # without output_size it reads the repeats back
        "aten._assert_async.msg",
    }
)
"""Operators that read a device tensor's values back to the host (or size their output by them)."""


def _host_sync(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether this call synchronises: a listed operator, a boolean-mask index (a hidden ``nonzero``), or a
    ``histc`` without fixed bounds (CUDA reads the input's min and max back)."""
    if name in HOST_SYNC:
        return name != "aten.repeat_interleave.Tensor" or kwargs.get("output_size") is None
    if name.startswith(("aten.index.Tensor", "aten.index_put")):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(index, torch.Tensor) and index.dtype == torch.bool for index in indices or ())
    if name == "aten.histc.default":
        low = args[2] if len(args) > 2 else kwargs.get("min", 0)
        high = args[3] if len(args) > 3 else kwargs.get("max", 0)
        return bool(low == high)
    return False


class OperatorLog(TorchDispatchMode):
    """Counts every operator dispatched inside it, and the host-synchronising ones apart (``syncs``)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        self.syncs: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = str(func)
        self.counts[name] += 1
        if _host_sync(name, args, kwargs):
            self.syncs[name] += 1
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.counts.values())
