"""Machines the tests do not have, simulated at torch's public surface: CUDA devices of a given memory and compute
capability (one or several), Apple's MPS, and the CPU's available memory.

The engine's own code runs unchanged (``diffgemma_engine.loading.plan.detect_devices``,
``diffgemma_engine.loading.placement``, ``diffgemma_engine.loading.quantize``,
``diffgemma_engine.loading.model.load_model``) down to ``DiffusionGemmaForBlockDiffusion.from_pretrained``, which is
checked and then loads on the CPU:

* torch's answers are the machine's: ``torch.cuda.is_available``, ``device_count``, ``get_device_properties``,
  ``get_device_capability``, ``mem_get_info``, ``current_device``, ``get_device_name``,
  ``torch.backends.mps.is_available`` / ``is_built``, ``torch.mps.recommended_max_memory`` and
  ``driver_allocated_memory``; the CPU's available memory is a ``/proc/meminfo``-format file the engine reads
  (``diffgemma_engine.loading.plan.devices.MEMINFO``).
* ``from_pretrained`` is called as the engine calls it (Python itself refuses a keyword given twice); the
  simulation then checks what a real machine would: the device map names only devices the machine has (``cpu``,
  ``disk``, its ``cuda:N``, ``mps``), a ``disk`` entry comes with an ``offload_folder``, and a quantization config
  is one the machine can run (torchao's int8 on CPU and CUDA, not MPS; transformers' fp8 only on CUDA devices of
  compute capability 8.9+, with the ``kernels`` package in transformers' range, and no ``cpu`` or ``disk`` in the
  map). Then the load itself happens on the CPU, with torch's real answers back for its duration: every simulated
  ``cuda:N`` and ``mps`` of the device map becomes ``cpu`` at that one call, nowhere else.

Use :func:`simulated` as a context manager; ``Simulation.loads`` records each ``from_pretrained`` call's arguments
as the engine passed them.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import torch

GIB = 1 << 30


class SimulatedLoadError(AssertionError):
    """A ``from_pretrained`` call the simulated machine could not have served."""


@attrs.frozen(kw_only=True)
class GPU:
    """One CUDA device: ``free`` bytes (``mem_get_info``), ``total`` (its properties), compute ``capability``."""

    free: int
    total: int
    capability: tuple[int, int]
    name: str = "simulated CUDA device"


@attrs.frozen(kw_only=True)
class Machine:
    """The devices a simulation answers for."""

    gpus: tuple[GPU, ...] = ()
    mps_limit: int | None = None
    """``torch.mps.recommended_max_memory`` (None: no MPS)."""
    mem_available: int = 64 * GIB
    """``MemAvailable`` of the CPU's memory (on Apple silicon the memory MPS shares)."""

    def names(self) -> set[str]:
        """The device names a device map may use here."""
        found = {"cpu", "disk", *(f"cuda:{index}" for index in range(len(self.gpus)))}
        return found | ({"mps"} if self.mps_limit is not None else set())


def machine_from_max_memory(spec: str, capability: tuple[int, int] | None = None) -> Machine:
    """The machine an accelerate-style ``--max-memory`` describes (``cuda:0=23GiB,cpu=64GiB``, ``mps=48GiB,cpu=12GiB``,
    as the README's machine table writes them): each GPU with that much free (and 1 GiB more in all) at
    ``capability``; MPS with that limit; the CPU with that much available beside it (MPS and the CPU share one
    memory, so the simulated ``MemAvailable`` is their sum)."""
    from diffgemma_engine.loading.plan import parse_max_memory

    devices = {device.name: device.bytes for device in parse_max_memory(spec)}
    gpus = []
    for name in sorted((name for name in devices if name.startswith("cuda:")), key=lambda name: int(name[5:])):
        if capability is None:
            raise ValueError(f"{spec}: a CUDA device needs a compute capability")
        gpus.append(GPU(free=devices[name], total=devices[name] + GIB, capability=capability))
    mps = devices.get("mps")
    cpu = devices.get("cpu", 4 * GIB)
    return Machine(gpus=tuple(gpus), mps_limit=mps, mem_available=cpu + (mps or 0))


def _index(device: object = None) -> int:
    """A CUDA device argument (None, an index, ``"cuda:1"``, ``torch.device``) as its index."""
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "cuda":
            raise ValueError(f"not a CUDA device: {device}")
        return device.index or 0
    raise TypeError(f"not a device: {device!r}")


class Simulation:
    """The patches of one simulated machine, installed and removed together."""

    def __init__(self, machine: Machine, meminfo: Path) -> None:
        self.machine = machine
        self.meminfo = meminfo
        self.loads: list[dict[str, Any]] = []
        self._saved: list[tuple[object, str, object, bool]] = []

    # -- torch's answers -------------------------------------------------------------------------------------

    def _gpu(self, device: object = None) -> GPU:
        index = _index(device)
        if not 0 <= index < len(self.machine.gpus):
            raise RuntimeError(f"CUDA error: invalid device ordinal {index} (the machine has {len(self.machine.gpus)})")
        return self.machine.gpus[index]

    def _properties(self, device: object = None) -> SimpleNamespace:
        gpu = self._gpu(device)
        major, minor = gpu.capability
        return SimpleNamespace(name=gpu.name, total_memory=gpu.total, major=major, minor=minor, multi_processor_count=1)

    def _patches(self) -> list[tuple[object, str, object]]:
        machine = self.machine
        has_mps = machine.mps_limit is not None
        return [
            (torch.cuda, "is_available", lambda: bool(machine.gpus)),
            (torch.cuda, "device_count", lambda: len(machine.gpus)),
            (torch.cuda, "current_device", lambda: 0),
            (torch.cuda, "get_device_properties", self._properties),
            (torch.cuda, "get_device_capability", lambda device=None: self._gpu(device).capability),
            (torch.cuda, "get_device_name", lambda device=None: self._gpu(device).name),
            (torch.cuda, "mem_get_info", lambda device=None: (self._gpu(device).free, self._gpu(device).total)),
            (torch.backends.mps, "is_available", lambda: has_mps),
            (torch.backends.mps, "is_built", lambda: has_mps),
            (torch.mps, "recommended_max_memory", lambda: machine.mps_limit or 0),
            (torch.mps, "driver_allocated_memory", lambda: 0),
            (torch.mps, "current_allocated_memory", lambda: 0),
        ]

    # -- installing ------------------------------------------------------------------------------------------

    def _set(self, owner: object, name: str, value: object) -> None:
        if isinstance(owner, type):  # a class: its own attribute, or one it inherits (removed again afterwards)
            had, old = name in owner.__dict__, owner.__dict__.get(name)
        else:
            had, old = hasattr(owner, name), getattr(owner, name, None)
        self._saved.append((owner, name, old, had))
        setattr(owner, name, value)

    def install(self) -> None:
        from transformers import DiffusionGemmaForBlockDiffusion

        from diffgemma_engine.loading.plan import devices as plan_devices

        available = self.machine.mem_available // 1024
        self.meminfo.write_text(f"MemTotal: {available + 1024 * 1024} kB\nMemAvailable: {available} kB\n")
        self._install_torch()
        self._set(plan_devices, "MEMINFO", self.meminfo)
        real = DiffusionGemmaForBlockDiffusion.from_pretrained.__func__  # type: ignore[attr-defined]
        simulation = self

        def from_pretrained(cls: type, *args: Any, **kwargs: Any) -> Any:
            simulation.loads.append(dict(kwargs))
            kwargs = simulation.checked(kwargs)
            with simulation.real_torch():
                return real(cls, *args, **kwargs)

        self._set(DiffusionGemmaForBlockDiffusion, "from_pretrained", classmethod(from_pretrained))

    def _install_torch(self) -> None:
        for owner, name, value in self._patches():
            self._set(owner, name, value)

    def uninstall(self) -> None:
        while self._saved:
            owner, name, value, had = self._saved.pop()
            if had:
                setattr(owner, name, value)
            else:
                delattr(owner, name)

    @contextlib.contextmanager
    def real_torch(self) -> Iterator[None]:
        """torch's own answers (this CPU's) for the duration: the load happens on this machine."""
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in self._patches()]
        for owner, name, _ in self._patches():
            original = next(value for o, n, value, _ in self._saved if o is owner and n == name)
            setattr(owner, name, original)
        try:
            yield
        finally:
            for owner, name, value in saved:
                setattr(owner, name, value)

    # -- the check of from_pretrained ------------------------------------------------------------------------

    def checked(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` checked against the machine (:class:`SimulatedLoadError` otherwise), the device map's
        simulated accelerators turned into ``cpu``."""
        where = kwargs.get("device_map")
        if not isinstance(where, dict) or not where:
            raise SimulatedLoadError(f"the engine places every load with an explicit device map, got {where!r}")
        devices = {str(value) for value in where.values()}
        unknown = devices - self.machine.names()
        if unknown:
            raise SimulatedLoadError(f"the device map names {sorted(unknown)}, which this machine does not have")
        if "disk" in devices and not kwargs.get("offload_folder"):
            raise SimulatedLoadError("the device map offloads to disk without an offload_folder")
        config = kwargs.get("quantization_config")
        kind = type(config).__name__ if config is not None else None
        if kind == "TorchAoConfig" and "mps" in devices:
            raise SimulatedLoadError("torchao's int8 has no MPS kernels")
        if kind == "FineGrainedFP8Config":
            self._check_fp8(devices)
        elif kind not in (None, "TorchAoConfig"):
            raise SimulatedLoadError(f"a quantization config the simulation does not know: {kind}")
        on_cpu = {key: ("cpu" if re.fullmatch(r"cuda:\d+|mps", str(value)) else value) for key, value in where.items()}
        if set(on_cpu.values()) == {"cpu"}:
            # One device now: a map of many entries all on the CPU would read to transformers as CPU offload
            # (torchao then moves each layer to CUDA to quantize it, as it does on the real machine).
            on_cpu = {"": "cpu"}
        return {**kwargs, "device_map": on_cpu}

    def _check_fp8(self, devices: set[str]) -> None:
        from transformers.utils.import_utils import is_kernels_available

        if devices & {"cpu", "disk", "mps"}:
            raise SimulatedLoadError(f"transformers refuses fp8 on the fly with {sorted(devices)} in the device map")
        for name in devices:
            if self._gpu(name).capability < (8, 9):
                raise SimulatedLoadError(f"{name} cannot run fp8 (compute capability {self._gpu(name).capability})")
        if not is_kernels_available():
            raise SimulatedLoadError("fp8's kernel needs the kernels package in transformers' range")


MACHINE_VARIABLE = "DIFFGEMMA_SIMULATED_MACHINE"
SITE = Path(__file__).resolve().parent / "simulated_site"
"""Holds the ``sitecustomize`` that installs ``$DIFFGEMMA_SIMULATED_MACHINE`` in a child Python process."""


def child_environment(machine: Machine, scratch: Path) -> dict[str, str]:
    """Variables that make a child Python process (``python -m ...``) run on ``machine``: the machine as JSON,
    and ``PYTHONPATH`` with :data:`SITE` and the repository first."""
    import json
    import os

    import cattrs

    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(SITE), str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    description = {"machine": cattrs.unstructure(machine), "scratch": str(scratch)}
    return {MACHINE_VARIABLE: json.dumps(description), "PYTHONPATH": path}


def install_from_environment() -> Simulation:
    """The machine :func:`child_environment` described, installed for the rest of this process."""
    import json
    import os

    import cattrs

    description = json.loads(os.environ[MACHINE_VARIABLE])
    simulation = Simulation(
        cattrs.structure(description["machine"], Machine), Path(description["scratch"]) / "child-meminfo"
    )
    simulation.install()
    return simulation


@contextlib.contextmanager
def simulated(machine: Machine, scratch: Path) -> Iterator[Simulation]:
    """``machine`` for the duration (its ``/proc/meminfo`` written under ``scratch``)."""
    simulation = Simulation(machine, scratch / "meminfo")
    simulation.install()
    try:
        yield simulation
    finally:
        simulation.uninstall()
