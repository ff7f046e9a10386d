"""DiffusionGemma without its vision tower: what the engine loads, since code completion never sends an image.

transformers builds the vision tower and its embedder unconditionally (``DiffusionGemmaEncoderModel.__init__``:
``AutoModel.from_config(config.vision_config)``; a config without ``vision_config`` gets the default Gemma 4 one),
and its encoder runs them only for ``pixel_values``. :class:`TextOnlyDiffusionGemma` is the same model with those
two modules removed as soon as they are built (on the meta device, inside ``from_pretrained``), and their tensors
named as keys to ignore: ``from_pretrained`` reads none of them from the checkpoint (for the release, 0.57 B
parameters and 1.1 GiB in bf16 that no device holds; ``diffgemma-engine plan`` prints the figure). Once loaded the
model is a plain ``DiffusionGemmaForBlockDiffusion`` again (its class is set back), so everything downstream,
``save_pretrained`` included, sees the usual class; a checkpoint saved from it has no vision weights.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from .quantize_policy import MULTIMODAL_MODULES

if TYPE_CHECKING:
    from transformers import DiffusionGemmaForBlockDiffusion


@cache
def _text_only_class() -> type[DiffusionGemmaForBlockDiffusion]:
    from transformers import DiffusionGemmaForBlockDiffusion

    class TextOnlyDiffusionGemma(DiffusionGemmaForBlockDiffusion):  # type: ignore[no-untyped-call]  # its hook
        """The encoder without ``vision_tower`` and ``embed_vision`` (and any audio sibling)."""

        _keys_to_ignore_on_load_unexpected = [rf"(?:^|\.){name}\." for name in MULTIMODAL_MODULES]

        def __init__(self, config: Any) -> None:
            super().__init__(config)
            encoder = self.model.encoder
            for name in MULTIMODAL_MODULES:
                if name in encoder._modules:
                    delattr(encoder, name)

    return TextOnlyDiffusionGemma


def from_pretrained(*args: Any, **kwargs: Any) -> DiffusionGemmaForBlockDiffusion:
    """``DiffusionGemmaForBlockDiffusion.from_pretrained(*args, **kwargs)`` without reading the vision tower."""
    from transformers import DiffusionGemmaForBlockDiffusion

    model = _text_only_class().from_pretrained(*args, **kwargs)
    model.__class__ = DiffusionGemmaForBlockDiffusion  # the same layout: only __init__ differed
    return model
