"""What the canvas maths reads off a loaded model: where its tensors go, the autograd mode it runs under, and its
text config. The loader (``diffgemma_engine.loading.placement``, ``diffgemma_engine.loading.quantize``,
``diffgemma_engine.loading.checkpoint_files``) builds on these; nothing here imports the loader. torch is imported where
it is used, so the loader's planning stays light."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar

if TYPE_CHECKING:
    import torch
    from transformers import DiffusionGemmaConfig, DiffusionGemmaTextConfig

    GradMode = type[torch.no_grad] | type[torch.inference_mode]

P = ParamSpec("P")
R = TypeVar("R")
ModelT = TypeVar("ModelT", bound="torch.nn.Module")

DISK = "disk"
"""accelerate's name, in a device map, for weights offloaded to disk."""


def execution_device(model: torch.nn.Module) -> torch.device:
    """Where the model's inputs and the engine's own tensors (prompt, canvas, caches, sampler) go: its device,
    or for a model spread by a device map the first accelerator in it (accelerate runs the modules offloaded to
    the CPU or disk there), else the CPU. Not ``model.device``: that is the first parameter's, ``meta`` when it
    was offloaded to disk."""
    import torch

    spread = getattr(model, "hf_device_map", None)
    if not spread:
        return next(iter(model.parameters())).device
    running = [name for name in map(_device_name, spread.values()) if name not in ("cpu", DISK)]
    return torch.device(running[0] if running else "cpu")


def _device_name(value: object) -> str:
    """A device map's value as a device name (accelerate writes CUDA devices as bare indices)."""
    return f"cuda:{value}" if isinstance(value, int) else str(value)


def grad_mode_for(model: torch.nn.Module) -> GradMode:
    """The autograd mode the engine may run ``model`` under: ``torch.inference_mode``, or ``torch.no_grad`` for a
    model with torchao tensors (whose eager experts fail under inference mode). Use as ``with grad_mode_for(m)():``
    or as a decorator factory."""
    import torch

    if any(type(tensor).__module__.startswith("torchao") for tensor in _tensors(model)):
        return torch.no_grad
    return torch.inference_mode


_GRAD_MODES: weakref.WeakKeyDictionary[torch.nn.Module, GradMode] = weakref.WeakKeyDictionary()


def grad_mode(model: torch.nn.Module) -> GradMode:
    """:func:`grad_mode_for`, worked out once per model (it walks every tensor)."""
    mode = _GRAD_MODES.get(model)
    if mode is None:
        mode = _GRAD_MODES[model] = grad_mode_for(model)
    return mode


def under_grad_mode(function: Callable[Concatenate[ModelT, P], R]) -> Callable[Concatenate[ModelT, P], R]:
    """Run ``function(model, ...)`` (the model passed first, by position) under its model's :func:`grad_mode`."""

    @functools.wraps(function)
    def run(model: ModelT, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with grad_mode(model)():
            return function(model, *args, **kwargs)

    return run


def _tensors(model: torch.nn.Module) -> Iterator[torch.Tensor]:
    for module in model.modules():
        yield from (tensor for tensor in module._parameters.values() if tensor is not None)
        yield from (tensor for tensor in module._buffers.values() if tensor is not None)


def text_config_of(config: DiffusionGemmaConfig) -> DiffusionGemmaTextConfig:
    """``config.text_config``, which transformers types as a config, a dict or None: a built ``DiffusionGemmaConfig``
    always holds a ``DiffusionGemmaTextConfig`` there (``TypeError`` otherwise)."""
    text = config.text_config
    if text is None or isinstance(text, dict):
        raise TypeError(f"the model's config.text_config is {type(text).__name__}, not a DiffusionGemmaTextConfig")
    return text
