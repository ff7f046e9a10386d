"""Which precision loads where (``diffgemma_engine.loading.loadable``): every refusal says why and what instead."""

from __future__ import annotations

import pytest

from diffgemma_engine.loading.loadable import Environment, refusal

HOPPER = {"cuda:0": (9, 0)}
READY = Environment(torchao="0.18.0", kernels="0.18.2", fp8_kernel_cached=True, capabilities=HOPPER)


@pytest.mark.parametrize("precision", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("devices", [("cpu",), ("mps",), ("cuda:0",), ("cuda:0", "cpu", "disk"), ("mps", "cpu")])
def test_plain_weights_load_everywhere(precision: str, devices: tuple[str, ...]) -> None:
    assert refusal(precision, devices, Environment(torchao=None, kernels=None)) is None


@pytest.mark.parametrize(
    ("precision", "devices", "env", "reason"),
    [
        ("int8", ("mps",), READY, "not on mps"),
        ("int8", ("mps", "cpu"), READY, "not on mps"),
        ("int8", ("cpu",), Environment(torchao=None, kernels=None), 'pip install "torchao==0.18.0"'),
        ("int8", ("cuda:0",), Environment(torchao="0.17.0", kernels=None), "torchao 0.17.0 is installed"),
        ("fp8", ("cpu",), READY, "needs a CUDA GPU"),
        ("fp8", ("mps",), READY, "needs a CUDA GPU"),
        ("fp8", ("cuda:0", "cpu"), READY, "refuses cpu"),
        ("fp8", ("cuda:0", "disk"), READY, "refuses disk"),
        ("fp8", ("cuda:1",), READY, "cuda:1's is not known"),
        ("fp8", ("cuda:0",), Environment(torchao=None, kernels="0.18.2", capabilities={"cuda:0": (8, 6)}), "has 8.6"),
        ("fp8", ("cuda:0",), Environment(torchao=None, kernels=None, capabilities=HOPPER), "not installed"),
        ("fp8", ("cuda:0",), Environment(torchao=None, kernels="0.19.0", capabilities=HOPPER), "0.19.0"),
        ("fp8", ("cuda:0",), Environment(torchao=None, kernels="0.18.2", capabilities=HOPPER), "offline"),
        (
            "fp8",
            ("cuda:0",),
            Environment(torchao=None, kernels="0.18.2", hub_kernels=False, capabilities=HOPPER),
            "USE_HUB_KERNELS",
        ),
        ("int4", ("cuda:0",), READY, "int4 is not available"),
    ],
)
def test_refusals_say_why_and_what_instead(
    precision: str, devices: tuple[str, ...], env: Environment, reason: str
) -> None:
    said = refusal(precision, devices, env)
    assert said is not None and reason in said, said
    assert "int8" in said or "bfloat16" in said or "torchao" in said  # an alternative, or the command to fix it


def test_what_loads() -> None:
    assert refusal("int8", ("cuda:0", "cpu", "disk"), READY) is None
    assert refusal("fp8", ("cuda:0",), READY) is None
    online = Environment(torchao=None, kernels="0.18.3", offline=False, capabilities={"cuda:0": (12, 0)})
    assert refusal("fp8", ("cuda:0",), online) is None  # fetched at the first step
