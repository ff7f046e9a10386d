"""vLLM's own request code, installed for the tests: the vLLM wheel without its dependencies, in a venv of its own
that sees this project's packages (torch, transformers) through a ``.pth`` file (the folder ``PROJECT_SITE_ENV``
names: the venv is the machine's, each clone's packages are its own) and adds the pure packages its
protocol modules import. Enough to parse and validate a request as ``vllm serve`` would
(``CompletionRequest``, ``to_sampling_params``, ``validate_diffusion_sampling_params``); nothing here runs a model.

vLLM pins ``torch==2.14.0`` and ``transformers<5.21``; its request code imports and runs with this project's
2.13.0 and 5.24 (pip warns of the pins). Built once per version and machine in the test cache
(tests/support/cache.py; about two minutes: the wheel is 336 MB), in the background while the light layers run
(tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from filelock import FileLock

from tests.support.cache import TEST_CACHE

VLLM_VERSION = "0.33.0"
VENV = TEST_CACHE / f"vllm-{VLLM_VERSION}-py{sys.version_info.major}{sys.version_info.minor}"
PROJECT_SITE_ENV = "DIFFGEMMA_PROJECT_SITE"
"""The folder of this project's packages, for the venv's ``.pth`` (``vllm_python`` sets it for the processes the
tests start)."""
SEE_PROJECT = f"import os, sys; site = os.environ.get({PROJECT_SITE_ENV!r}); site and sys.path.append(site)\n"
"""The venv's ``.pth``: a line that starts with ``import`` is run at start-up."""
WHEELS = TEST_CACHE / "wheels"
PURE_PACKAGES = (
    "pydantic",
    "msgspec",
    "cbor2",
    "pyzmq",
    "openai",
    "openai-harmony",
    "pillow",
    "pybase64",
    "uvloop",
    "py-cpuinfo",
    "fastapi",
    "prometheus-client",
    "psutil",
    "cachetools",
    "cloudpickle",
    "urllib3",
    "requests",
    "partial-json-parser",
    "llguidance",
    "einops",
    "uvicorn",
    "watchfiles",
)
"""What ``vllm.entrypoints.openai.completion.protocol``, ``vllm.utils.diffusion``, ``vllm serve``'s argument
parser (``vllm.entrypoints.common.cli_args``), its launcher (``vllm.entrypoints.launchers.launcher``: the ``--uds``
bind) and the served model's ``ModelConfig`` (its architecture inspected) import beyond torch and transformers
(found by importing them)."""
WITHOUT_DEPENDENCIES = ("xgrammar==0.2.8", "apache-tvm-ffi==0.1.11")
"""Imported by the argument parser, pinned by vLLM; without its dependencies (triton, 1 GB, is not needed to
import it)."""
RECIPE = f"{VLLM_VERSION}+serve-args+model-config+project-site-env"
"""What a finished venv holds (``.complete``): a venv of another recipe is built again."""


def _pip(python: Path, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args], check=True)


def vllm_python() -> Path:
    """The Python of the venv holding vLLM's request code, built when missing; what this process starts from now on
    runs it with this project's packages (``PROJECT_SITE_ENV``)."""
    os.environ[PROJECT_SITE_ENV] = sysconfig.get_paths()["purelib"]
    python = VENV / "bin" / "python"
    done = VENV / ".complete"
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(VENV) + ".lock"):
        if done.is_file() and done.read_text() == RECIPE:
            return python
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        (Path(purelib) / "diffgemma-project.pth").write_text(SEE_PROJECT)
        _pip(python, *PURE_PACKAGES)
        _pip(python, "--no-deps", *WITHOUT_DEPENDENCIES)
        WHEELS.mkdir(parents=True, exist_ok=True)
        wheels = sorted(WHEELS.glob(f"vllm-{VLLM_VERSION}-*.whl"))
        if not wheels:
            command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"vllm=={VLLM_VERSION}"]
            subprocess.run([*command, "-d", str(WHEELS)], check=True)
            wheels = sorted(WHEELS.glob(f"vllm-{VLLM_VERSION}-*.whl"))
        _pip(python, "--no-deps", str(wheels[-1]))
        done.write_text(RECIPE)
    return python


class VllmChecker:
    """vLLM's own request and response code in a process of the vLLM venv (tests/support/vllm_check.py), asked one
    question at a time."""

    def __init__(self, python: Path) -> None:
        self.process = subprocess.Popen(
            [str(python), str(Path(__file__).with_name("vllm_check.py"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def _ask(self, kind: str, data: object) -> Any:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"kind": kind, "data": data}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"vllm_check.py exited with {self.process.wait()}"
        return json.loads(line)

    def requests(self, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each case (``{"body", "canvas_length", "vocab_size"}``) parsed and validated as ``vllm serve`` would:
        ``{"ok": True, "params": ...}`` or ``{"ok": False, "error": ...}``."""
        answer: list[dict[str, Any]] = self._ask("requests", cases)
        return answer

    def serve_args(self, argv: list[str]) -> dict[str, Any]:
        """A ``vllm serve`` command line (after ``vllm serve``) as vLLM's own parser reads it: what it would serve
        (model, uds, canvas_length, max_denoising_steps, max_num_seqs, tensor_parallel_size, enable_prefix_caching),
        or ``{"error": ...}``."""
        answer: dict[str, Any] = self._ask("serve_args", argv)
        return answer

    def served_config(self, model_dir: Path) -> dict[str, Any]:
        """What vLLM's Gemma 4 code reads of the config of the checkpoint in ``model_dir``, as ``vllm serve`` loads
        it: ``default_output_length``, ``final_logit_softcapping`` (None where it has none), ``is_diffusion``."""
        answer: dict[str, Any] = self._ask("served_config", str(model_dir))
        return answer

    def reply(self, spec: dict[str, Any]) -> dict[str, Any]:
        """A ``/v1/completions`` reply built with vLLM's own response classes from ``spec`` (choices, usage)."""
        answer: dict[str, Any] = self._ask("reply", spec)
        return answer

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)
