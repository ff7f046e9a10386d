"""A check that a load really quantized: bytes per kind of weight against bfloat16, tensor types, and ties kept.

Run after every quantized load (``diffgemma_engine.loading.model``); its report is what ``doctor`` shows. The methods
and their ``from_pretrained`` arguments are ``diffgemma_engine.loading.quantize``'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import attrs

from ..canvas.runtime import grad_mode_for
from ..errors import ModelLoadError
from .quantize import EXPERTS_IMPLEMENTATION, QUANTIZATIONS, converted, is_quantized_tensor
from .quantize_policy import EXPERT_WEIGHTS

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel


@attrs.frozen(kw_only=True)
class QuantizedReport:
    """What a load holds, per kind of weight (``diffgemma_engine.loading.plan.KINDS``): bytes now, and what bfloat16
    would hold.

    Bytes are storage bytes, a tied tensor counted once and a tensor subclass by its inner tensors (data, scales,
    zero points).
    """

    method: str
    bytes_by_kind: dict[str, int]
    bf16_bytes_by_kind: dict[str, int]
    converted_bytes: int
    """The tensors the policy converts (and their scales), as held."""
    converted_bf16_bytes: int
    converted_tensors: int
    """Tensors the policy converts, each tied tensor once."""
    experts_implementation: str | None
    grad_mode: str

    @property
    def bytes(self) -> int:
        return sum(self.bytes_by_kind.values())

    @property
    def bf16_bytes(self) -> int:
        return sum(self.bf16_bytes_by_kind.values())

    @property
    def converted_saving(self) -> float:
        """The fraction of the converted tensors' bfloat16 bytes saved."""
        return 1.0 - self.converted_bytes / self.converted_bf16_bytes if self.converted_bf16_bytes else 0.0

    def summary(self) -> str:
        """One line for the engine's log."""
        kinds = ", ".join(
            f"{kind} {_mib(self.bf16_bytes_by_kind.get(kind, 0))} -> {_mib(size)}"
            for kind, size in self.bytes_by_kind.items()
        )
        saving = f"converted tensors {self.converted_saving:.0%} smaller; " if self.method != "none" else ""
        return (
            f"{self.method}: weights {_mib(self.bf16_bytes)} in bfloat16 -> {_mib(self.bytes)} ({kinds}); "
            f"{saving}experts {self.experts_implementation}, {self.grad_mode}"
        )

    def to_json(self) -> dict[str, Any]:
        """For ``doctor`` and ``state``."""
        return {
            "method": self.method,
            "bytes": self.bytes,
            "bf16_bytes": self.bf16_bytes,
            "bytes_by_kind": dict(self.bytes_by_kind),
            "bf16_bytes_by_kind": dict(self.bf16_bytes_by_kind),
            "converted_bytes": self.converted_bytes,
            "converted_bf16_bytes": self.converted_bf16_bytes,
            "converted_saving": round(self.converted_saving, 4),
            "converted_tensors": self.converted_tensors,
            "experts_implementation": self.experts_implementation,
            "grad_mode": self.grad_mode,
        }


def _mib(count: int) -> str:
    return f"{count / (1 << 20):.1f} MiB"


def _leaves(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """The plain tensors that hold ``tensor``'s data (itself, or a subclass's inner tensors)."""
    import torch

    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) and hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        for name in names:
            yield from _leaves(getattr(tensor, name))
    else:
        yield tensor


def _storage_key(leaf: torch.Tensor) -> tuple[int, int]:
    storage = leaf.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


@attrs.define
class _Tally:
    """What one pass over a model's tensors finds: bytes held and bfloat16's per kind, the converted tensors, and
    those the policy and the load disagree on."""

    method: str
    held: dict[str, int] = attrs.Factory(dict)
    bf16: dict[str, int] = attrs.Factory(dict)
    converted_bytes: int = 0
    converted_bf16: int = 0
    converted_count: int = 0
    left_plain: list[str] = attrs.Factory(list)
    wrongly_converted: list[str] = attrs.Factory(list)
    seen_storage: set[tuple[int, int]] = attrs.Factory(set)

    def add(self, name: str, tensor: torch.Tensor, owner: object) -> None:
        """Count ``tensor`` (seen once) held by the module ``owner`` under ``name``."""
        import torch

        from .plan import kind_of

        kind = kind_of(
            name.removesuffix("_scale_inv"),
            linear=isinstance(owner, torch.nn.Linear),
            embedding=isinstance(owner, torch.nn.Embedding),
        )
        size = 0
        for leaf in _leaves(tensor):
            key = _storage_key(leaf)
            if key not in self.seen_storage:
                self.seen_storage.add(key)
                size += key[1]
        scale = name.endswith("_scale_inv")  # fp8's scales: no bfloat16 counterpart
        plain_size = 0 if scale else 2 * tensor.numel()
        self.held[kind] = self.held.get(kind, 0) + size
        self.bf16[kind] = self.bf16.get(kind, 0) + plain_size
        is_buffer = not isinstance(tensor, torch.nn.Parameter)
        should = not is_buffer and tensor.dim() >= 2 and converted(name)
        if should or (scale and converted(name)):
            self.converted_bytes += size
            self.converted_bf16 += plain_size
        if scale:
            return
        if should:
            self.converted_count += 1
        quantized = is_quantized_tensor(tensor)
        if self.method != "none" and should and not quantized:
            self.left_plain.append(name)
        elif quantized and (self.method == "none" or not should):
            self.wrongly_converted.append(name)

    def refuse_a_bad_load(self) -> None:
        """``ModelLoadError`` when a tensor is left plain or wrongly converted, or the load saves nothing."""
        method = self.method
        if self.left_plain:
            experts = [name for name in self.left_plain if name.rpartition(".")[2] in EXPERT_WEIGHTS]
            what = "the routed experts are" if experts else "some text weights are"
            raise ModelLoadError(
                f"{method}: {what} not quantized ({len(self.left_plain)} of {self.converted_count} tensors left "
                f"plain, e.g. {', '.join((experts or self.left_plain)[:3])}): the load would save next to nothing. A "
                "quantizer's default skip list (every tied key) or one that misses the fused expert tensors does this"
            )
        if self.wrongly_converted:
            raise ModelLoadError(
                f"{method}: {len(self.wrongly_converted)} tensors that stay bfloat16 by engine.quantize_policy were "
                f"converted (e.g. {', '.join(self.wrongly_converted[:3])})"
            )
        if method != "none" and self.converted_bytes >= self.converted_bf16:
            raise ModelLoadError(
                f"{method}: the converted tensors hold {self.converted_bytes} bytes, bfloat16 would hold "
                f"{self.converted_bf16}: the load would save nothing"
            )


def verify_quantized(model: PreTrainedModel, method: str) -> QuantizedReport:
    """Check a model right after its load (and ``quantize.finish_load``) against ``method``; ``ModelLoadError``
    when

    * a tensor the policy converts is left plain, the routed experts first (the load would save next to nothing),
      or a tensor the policy keeps was converted;
    * encoder and decoder no longer share one copy of a tensor (the quantized model would hold two);
    * the converted tensors are not smaller than bfloat16 would be (the load would save nothing);
    * the experts run an implementation the method's tensors do not support.

    ``none`` checks only that nothing is quantized and the ties hold.
    """
    if method not in QUANTIZATIONS:
        raise ModelLoadError(f"unknown quantization {method!r}: use one of {', '.join(QUANTIZATIONS)}")
    modules = dict(model.named_modules())
    seen_tensors: set[int] = set()
    tally = _Tally(method=method)
    for name, tensor in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        if id(tensor) not in seen_tensors:
            seen_tensors.add(id(tensor))
            tally.add(name, tensor, modules.get(name.rpartition(".")[0]))
    _check_ties(model)
    tally.refuse_a_bad_load()
    implementation = getattr(model.config, "_experts_implementation", None)
    needed = EXPERTS_IMPLEMENTATION.get(method)
    if needed is not None and implementation != needed:
        raise ModelLoadError(
            f"{method}: the experts run {implementation!r}, which its tensors do not support; load with "
            f"experts_implementation={needed!r}"
        )
    return QuantizedReport(
        method=method,
        bytes_by_kind=tally.held,
        bf16_bytes_by_kind=tally.bf16,
        converted_bytes=tally.converted_bytes,
        converted_bf16_bytes=tally.converted_bf16,
        converted_tensors=tally.converted_count,
        experts_implementation=implementation,
        grad_mode=grad_mode_for(model).__name__,
    )


def _check_ties(model: PreTrainedModel) -> None:
    """Every tensor the config ties (the encoder's text stack to the decoder) is one object with its source, or at
    least one storage. The map is recomputed from the model as it is now: a swapped module's new tensors count."""
    tensors: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    pairs = [
        (target, source)
        for target, source in model.get_expanded_tied_weights_keys(all_submodels=True).items()
        if target in tensors and source in tensors
    ]
    untied = []
    for target, source in pairs:
        a, b = tensors[target], tensors[source]
        if a is not b and [_storage_key(x) for x in _leaves(a)] != [_storage_key(x) for x in _leaves(b)]:
            untied.append(target)
    if untied:
        raise ModelLoadError(
            f"encoder and decoder no longer share one copy of {len(untied)} of {len(pairs)} tied tensors (e.g. "
            f"{', '.join(untied[:3])}): the model would hold the text stack twice. Quantizing after the load, or a "
            "tie map computed before a module swap, does this"
        )
