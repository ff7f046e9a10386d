"""What the released DiffusionGemma-26B-A4B needs on the machines its users own, and the speed their memory
bandwidth allows: the README's machine table, computed (no GPU needed).

    python -m benchmarks.machine_table [--model DIR]   # default: the release's config (tests/data/release)

For each machine it asks the memory plan (``diffgemma_engine.loading.plan``: the model on the meta device, no weights)
where the weights go at each precision and which setting it recommends, then computes the floor of one denoising step:
every step reads the weights of every layer that runs (a 256-token canvas with 8 of 128 experts per token
touches nearly every expert of every layer: 1 - (120/128)^256 > 0.99999), so the step can be no faster than
those bytes over the memory bandwidth. The vision tower is not loaded for code (``diffgemma_engine.loading.text_only``)
and not counted. Bandwidths are the vendors' figures; with offload, the part on the CPU is read over the host's
memory (and PCIe; on a Mac, the one memory MPS shares). A setting the loader would refuse on the machine (int8 on
MPS; fp8 without the ``kernels`` package, which this project does not install) is not given
(``diffgemma_engine.loading.loadable``). Everything here is computed, not measured. Writes
``benchmarks/results/machine_table.json`` and prints the Markdown table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.report import RESULTS, write_json
from diffgemma_engine.loading import loadable, plan

ROOT = Path(__file__).resolve().parents[1]

GIB = 1 << 30
CANVAS_STEPS = (16, 48)
"""Steps for a 256-token canvas: a typical early stop, and the release's maximum (every step run)."""
PCIE_BYTES_S = 25e9
"""Host-to-GPU bandwidth an offloaded layer is read at (PCIe 4.0 x16, in practice)."""
MACHINES = [
    {
        "machine": "one 80 GB GPU (H100 SXM)",
        "max_memory": "cuda:0=79GiB,cpu=64GiB",
        "capability": (9, 0),
        "bandwidth": {"cuda:0": 3.35e12, "cpu": PCIE_BYTES_S},
        "precisions": ("bfloat16", "fp8", "int8"),
        "elsewhere": "vLLM with the NVFP4 build for many users at once",
    },
    {
        "machine": "one 24 GB card (RTX 4090)",
        "max_memory": "cuda:0=23GiB,cpu=64GiB",
        "capability": (8, 9),
        "bandwidth": {"cuda:0": 1.01e12, "cpu": PCIE_BYTES_S},
        "precisions": ("bfloat16", "int8"),
        "elsewhere": "vLLM with the NVFP4 build (17.5 GB) on a 5090; llama.cpp's GGUF Q4_K_M (16 GB)",
    },
    {
        "machine": "one 32 GB card (RTX 5090)",
        "max_memory": "cuda:0=31GiB,cpu=64GiB",
        "capability": (12, 0),
        "bandwidth": {"cuda:0": 1.79e12, "cpu": PCIE_BYTES_S},
        "precisions": ("bfloat16", "fp8", "int8"),
        "elsewhere": "vLLM with the NVFP4 build (17.5 GB), Blackwell's FP4 kernels",
    },
    {
        "machine": "two 24 GB cards (2x RTX 4090)",
        "max_memory": "cuda:0=23GiB,cuda:1=23GiB,cpu=64GiB",
        "capability": (8, 9),
        "bandwidth": {"cuda:0": 1.01e12, "cuda:1": 1.01e12, "cpu": PCIE_BYTES_S},
        "precisions": ("bfloat16", "int8"),
        "elsewhere": "vLLM with tensor parallelism: it reads both cards at once (here one card runs after the other)",
    },
    {
        "machine": "a Mac with 64 GB (M3 Max, MPS)",
        "max_memory": "mps=48GiB,cpu=12GiB",
        "bandwidth": {"mps": 400e9, "cpu": 400e9},
        "precisions": ("bfloat16", "int8"),
        "elsewhere": "MLX with its 4-bit build: bf16 needs more than the 48 GiB (3/4 of 64) that MPS may use, and "
        "int8 has no MPS kernels",
    },
    {
        "machine": "a Mac with 128 GB (M3 Max, MPS)",
        "max_memory": "mps=96GiB,cpu=24GiB",
        "bandwidth": {"mps": 400e9, "cpu": 400e9},
        "precisions": ("bfloat16", "int8"),
        "elsewhere": "MLX with its 4-bit or mxfp8 build: fewer bytes per step",
    },
    {
        "machine": "a CPU box with 64 GB (dual-channel DDR5)",
        "max_memory": "cpu=60GiB",
        "bandwidth": {"cpu": 80e9},
        "precisions": ("bfloat16", "int8"),
        "elsewhere": "llama.cpp's GGUF Q4_K_M build (16 GB: about 3x fewer bytes per step)",
    },
]


def step_floor_ms(placement: plan.Placement, sizes: dict[str, int], bandwidth: dict[str, float]) -> float:
    """Milliseconds to read each device's share of the weights that run once (the vision tower excluded)."""
    seconds = 0.0
    for share in placement.shares:
        read = sum(sizes[unit] for unit in share.units)
        seconds += read / bandwidth.get(share.device, bandwidth.get("cpu", PCIE_BYTES_S))
    return seconds * 1000


def environment(machine: dict) -> loadable.Environment:
    """What the loader finds on ``machine`` as this project installs it (``make setup`` with the ``quant`` extra):
    torchao 0.18, no ``kernels`` package (so no fp8), its GPUs' compute capability."""
    gpus = [device.name for device in plan.parse_max_memory(machine["max_memory"]) if device.name.startswith("cuda:")]
    return loadable.Environment(
        torchao=f"{loadable.TORCHAO_SERIES}.0",
        kernels=None,
        capabilities=dict.fromkeys(gpus, machine["capability"]) if gpus else {},
    )


def machine_row(spec: plan.ModelSpec, machine: dict) -> dict:
    devices = plan.parse_max_memory(machine["max_memory"])
    result = plan.make_plan(spec, devices, precisions=machine["precisions"], env=environment(machine))
    rows = []
    for placement in result.placements:
        sizes = dict(plan.placement_units(plan.text_weights(spec.weights), placement.precision))  # not loaded
        floor = step_floor_ms(placement, sizes, machine["bandwidth"]) if placement.setting else None
        rows.append(
            {
                "precision": placement.precision,
                "verdict": placement.verdict,
                "setting": placement.setting,
                "refused": placement.refused,
                "weights_gib": round(result.loaded_bytes[placement.precision] / GIB, 1),
                "step_floor_ms": None if floor is None else round(floor, 1),
                "tokens_per_s_ceiling": {
                    str(steps): None if floor is None else round(256 / (steps * floor / 1000)) for steps in CANVAS_STEPS
                },
            }
        )
    chosen = result.recommendation
    return {
        "machine": machine["machine"],
        "max_memory": machine["max_memory"],
        "bandwidth_gb_s": {name: value / 1e9 for name, value in machine["bandwidth"].items()},
        "placements": rows,
        "recommended": None if chosen is None else chosen.precision,
        "elsewhere": machine["elsewhere"],
    }


def markdown(rows: list[dict]) -> str:
    lines = [
        "| machine | what it needs | command | step floor (computed) | 256 tokens, 16 / 48 steps | better served by |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        best = next((p for p in row["placements"] if p["precision"] == row["recommended"]), None)
        if best is None:
            lines.append(f"| {row['machine']} | does not fit | - | - | - | {row['elsewhere']} |")
            continue
        ceiling = best["tokens_per_s_ceiling"]
        need = f"{best['precision']}, {best['weights_gib']} GiB, {best['verdict'].replace('_', ' ')}"
        lines.append(
            f"| {row['machine']} | {need} | `diffgemma-engine serve {best['setting']}` | {best['step_floor_ms']} ms "
            f"| {ceiling['16']} / {ceiling['48']} tok/s at most | {row['elsewhere']} |"
        )
    return "\n".join(lines)


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "tests" / "data" / "release")
    parser.add_argument("--out", type=Path, default=RESULTS / "machine_table.json")
    args = parser.parse_args()
    spec = plan.read_spec(args.model)
    rows = [machine_row(spec, machine) for machine in MACHINES]
    report = {
        "model": str(args.model),
        "parameters": spec.parameters,
        "computed": True,
        "note": "floors: the bytes of the weights that run, read once per step at the vendor's bandwidth",
        "machines": rows,
    }
    write_json(args.out, report)
    print(markdown(rows))


if __name__ == "__main__":
    main()
