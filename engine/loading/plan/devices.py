"""The devices a plan places on: parsed from ``--max-memory`` / ``--device``, or detected on this machine."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .records import (
    Device,
    PlanError,
)

if TYPE_CHECKING:
    pass


MEMINFO = Path("/proc/meminfo")
"""Where the CPU's available memory is read (Linux; elsewhere ``sysconf``)."""
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]i?b|b)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20}
_UNITS |= {"gib": 1 << 30, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes of ``24GiB``, ``24GB`` (decimal, as accelerate reads it), ``512MiB`` or a plain number of bytes."""
    match = _SIZE.match(text)
    if match is None:
        raise PlanError(f"cannot read the size {text!r}: write it like 24GiB, 24GB or 512MiB")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "b").lower()])


def device_name(key: str) -> str:
    """``cuda:N``, ``mps`` or ``cpu`` for a device key: ``0`` and ``cuda`` (accelerate's style) are CUDA devices."""
    key = key.strip().lower()
    if key.isdigit():
        return f"cuda:{int(key)}"
    if key == "cuda":
        return "cuda:0"
    if key.startswith("cuda:") and key[5:].isdigit():
        return f"cuda:{int(key[5:])}"
    if key in ("mps", "cpu"):
        return key
    raise PlanError(f"unknown device {key!r}: use cuda:N (or N), mps or cpu (disk offload is not planned)")


def sort_devices(devices: Iterable[Device]) -> list[Device]:
    """CUDA devices by index, then MPS, then the CPU: the order they are filled in."""

    def key(device: Device) -> tuple[int, int]:
        if device.name.startswith("cuda:"):
            return (0, int(device.name[5:]))
        return (1, 0) if device.name == "mps" else (2, 0)

    return sorted(devices, key=key)


def parse_max_memory(spec: str) -> list[Device]:
    """Devices described as accelerate's ``max_memory``: ``cuda:0=24GiB,cpu=64GiB`` (or ``0=24GiB,cpu=64GiB``)."""
    devices: dict[str, Device] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise PlanError(f"--max-memory: {item!r} is not DEVICE=SIZE (e.g. cuda:0=24GiB,cpu=64GiB)")
        name = device_name(key)
        if name in devices:
            raise PlanError(f"--max-memory names {name} twice")
        devices[name] = Device(name=name, bytes=parse_size(value), source="--max-memory")
    if not devices:
        raise PlanError("--max-memory is empty: describe devices like cuda:0=24GiB,cpu=64GiB")
    return sort_devices(devices.values())


def select_devices(devices: Sequence[Device], spec: str | None) -> list[Device]:
    """The devices ``--device`` names (``auto``: all of them): ``cpu``, ``cuda`` (every CUDA device), ``cuda:0``,
    ``cuda:0,1`` or ``cuda:0,cpu``."""
    if spec in (None, "", "auto"):
        return sort_devices(devices)
    available = {device.name: device for device in devices}
    wanted: list[str] = []
    for item in filter(None, (part.strip().lower() for part in spec.split(","))):
        if item == "cuda":
            wanted += [name for name in available if name.startswith("cuda:")] or ["cuda:0"]
        elif item.isdigit() and wanted and wanted[-1].startswith("cuda:"):
            wanted.append(f"cuda:{int(item)}")
        else:
            wanted.append(device_name(item))
    missing = [name for name in wanted if name not in available]
    if missing:
        found = ", ".join(available) or "none"
        raise PlanError(f"--device {spec}: no {', '.join(missing)} here (devices: {found})")
    return sort_devices(available[name] for name in dict.fromkeys(wanted))


def cpu_memory() -> Device:
    """The CPU and the memory available to a new process (``MemAvailable``, else free pages)."""
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return Device(name="cpu", bytes=int(line.split()[1]) * 1024, source=f"{MEMINFO} MemAvailable")
    except (OSError, ValueError, IndexError):
        pass
    page = os.sysconf("SC_PAGE_SIZE")
    for name in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
        try:
            return Device(name="cpu", bytes=os.sysconf(name) * page, source=f"sysconf {name}")
        except (ValueError, OSError):
            continue
    return Device(name="cpu", bytes=0, source="unknown")


def detect_devices() -> list[Device]:
    """The devices of this machine: each CUDA device's free memory, MPS's recommended limit, the CPU's RAM.

    On Apple silicon MPS and the CPU share one memory: the CPU is given what is left of it beside MPS's limit, so a
    placement over ``mps,cpu`` never counts a byte twice.
    """
    import torch

    found: list[Device] = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            free, _total = torch.cuda.mem_get_info(index)
            found.append(Device(name=f"cuda:{index}", bytes=int(free), source="torch.cuda.mem_get_info (free)"))
    cpu = cpu_memory()
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        limit = int(torch.mps.recommended_max_memory())
        found.append(Device(name="mps", bytes=limit, source="torch.mps.recommended_max_memory"))
        cpu = Device(name="cpu", bytes=max(0, cpu.bytes - limit), source=f"{cpu.source} less MPS's limit (one memory)")
    found.append(cpu)
    return sort_devices(found)
