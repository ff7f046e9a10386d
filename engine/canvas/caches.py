"""The caches a canvas is denoised against: the encoder's prefill, reused from one keystroke to the next, and the
decoder's views of it, one per row or stacked for a batch. Torch and transformers only.

Each document keeps a *master* cache: a plain ``DynamicCache()`` whose layers all keep every key and value
(sliding layers included), so it can be cut back to any length. On a request the longest common token prefix
with the master's tokens is kept, the rest is cropped, and only the new tokens are encoded. The encoder's
masks come from the model config, so the sliding window still applies while encoding.

The decoder must not see the master directly: its sliding layers would attend to every cached token. It gets
a *view* instead, a config-shaped ``DynamicCache`` whose sliding layers hold the last ``window - 1`` tokens,
exactly as a cache built from scratch (no copy, except the last ``window - 1`` keys and values of a sliding layer
once the prompt is longer than that: the views share the master's tensors, and the decoder never writes to a
cache).

Requests denoised together have prompts of different lengths: ``stack_rows`` left-pads each row's view to the
longest and gives the decoder the mask that hides the padding and each row's own canvas positions.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from .runtime import execution_device, grad_mode

if TYPE_CHECKING:
    from transformers import DiffusionGemmaForBlockDiffusion, PreTrainedConfig

DEFAULT_SLOTS = 16


def encode_prompt(model: DiffusionGemmaForBlockDiffusion, input_ids: torch.Tensor, cache: DynamicCache) -> int:
    """Run the causal encoder over ``input_ids`` (B, P), appending to ``cache``. Returns the new cache length."""
    past = cache.get_seq_length()
    batch, length = input_ids.shape
    total = past + length
    position_ids = torch.arange(past, total, dtype=torch.int32, device=input_ids.device).unsqueeze(0)
    attention_mask = torch.ones((batch, total), dtype=torch.bool, device=input_ids.device)
    encoder = model.model.encoder
    masks = encoder.create_masks_for_generate(
        config=model.config,
        inputs_embeds=torch.empty((batch, length, 0), dtype=model.dtype, device=input_ids.device),
        attention_mask=attention_mask,
        cache=cache,
        position_ids=position_ids,
    )
    encoder(input_ids=input_ids, attention_mask=masks, cache=cache, position_ids=position_ids)
    return total


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    limit = min(len(a), len(b))
    for index in range(limit):
        if a[index] != b[index]:
            return index
    return limit


def _dense(tensor: torch.Tensor) -> torch.Tensor:
    """A copy with the strides of a freshly allocated tensor (``contiguous()`` keeps a size-1 dimension's stride)."""
    return tensor.clone(memory_format=torch.contiguous_format)


def attention_layer(layer: object) -> DynamicLayer:
    """A ``DynamicCache`` layer as the key/value layer it is here: transformers types ``cache.layers`` as any kind of
    cache layer (linear-attention states, placeholders too), and DiffusionGemma's config makes only full-attention
    and sliding-window ones, each a ``DynamicLayer`` (``TypeError`` for any other)."""
    if not isinstance(layer, DynamicLayer):
        raise TypeError(f"a {type(layer).__name__} cache layer holds no keys and values")
    return layer


def keys_values(layer: object) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values of a filled ``DynamicCache`` layer (``attention_layer``; transformers types them None
    until the layer is first written)."""
    layer = attention_layer(layer)
    if layer.keys is None or layer.values is None:
        raise ValueError("the cache layer holds no keys and values yet: encode a prompt into it first")
    return layer.keys, layer.values


def decoder_view(master: DynamicCache, length: int, text_config: PreTrainedConfig) -> DynamicCache:
    """A cache for the decoder holding the first ``length`` tokens of ``master``, sliding layers windowed."""
    view = DynamicCache(config=text_config)
    for source, layer in zip(master.layers, view.layers, strict=True):
        keys, values = keys_values(source)
        keys, values = keys[:, :, :length], values[:, :, :length]
        target = attention_layer(layer)
        if isinstance(target, DynamicSlidingWindowLayer):
            keep = target.sliding_window - 1
            if length > keep:  # contiguous, like a short prompt's cache: the layout the compiled step is traced on
                keys, values = _dense(keys[:, :, -keep:]), _dense(values[:, :, -keep:])
            target.lazy_initialization(keys, values)
            target.cumulative_length = length
        else:
            target.lazy_initialization(keys, values)
        target.keys, target.values = keys, values
    return view


class PrefixCache:
    """Per-key (connection, document) master caches, least recently used evicted first."""

    def __init__(self, model: DiffusionGemmaForBlockDiffusion, slots: int = DEFAULT_SLOTS) -> None:
        self.model = model
        self.text_config = model.config.get_text_config(decoder=True)
        self.slots = slots
        self._masters: collections.OrderedDict[Hashable, tuple[DynamicCache, list[int]]] = collections.OrderedDict()

    def drop_others(self, key: Hashable) -> int:
        """Forget every document's encoded prompt but ``key``'s (to free memory); how many were dropped."""
        kept = self._masters.pop(key, None)
        dropped = len(self._masters)
        self._masters.clear()
        if kept is not None:
            self._masters[key] = kept
        return dropped

    def prepare(self, key: Hashable, ids: list[int]) -> tuple[DynamicCache, int]:
        """Encode what ``ids`` (B=1) does not share with ``key``'s last prompt; returns (decoder view, reused)."""
        master, cached_ids = self._masters.pop(key, (None, []))
        if master is None:
            master = DynamicCache()
        reused = min(common_prefix_length(cached_ids, ids), len(ids) - 1)  # the encoder needs >= 1 new token
        if master.get_seq_length() > reused:
            master.crop(reused - master.get_seq_length())
        device = execution_device(self.model)
        with grad_mode(self.model)():  # the view's copies too: the compiled step is traced on inference tensors
            encode_prompt(self.model, torch.tensor([ids[reused:]], dtype=torch.long, device=device), master)
            view = decoder_view(master, len(ids), self.text_config)
        self._masters[key] = (master, list(ids))
        while len(self._masters) > self.slots:
            self._masters.popitem(last=False)
        return view, reused


def stack_views(views: list[DynamicCache], text_config: PreTrainedConfig) -> tuple[DynamicCache, torch.Tensor]:
    """One batched cache from per-row decoder views, left-padded; returns it with its (B, L) padding mask."""
    lengths = [view.get_seq_length() for view in views]
    longest = max(lengths)
    batched = DynamicCache(config=text_config)
    for index, target in enumerate(batched.layers):
        layer = attention_layer(target)
        width = min(longest, layer.sliding_window - 1) if isinstance(layer, DynamicSlidingWindowLayer) else longest
        rows = [keys_values(view.layers[index]) for view in views]
        keys = torch.cat([F.pad(k, (0, 0, width - k.shape[2], 0)) for k, _ in rows])
        values = torch.cat([F.pad(v, (0, 0, width - v.shape[2], 0)) for _, v in rows])
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
        if isinstance(layer, DynamicSlidingWindowLayer):
            layer.cumulative_length = longest
    mask = torch.zeros((len(views), longest), dtype=torch.bool, device=keys_values(views[0].layers[0])[0].device)
    for row, length in enumerate(lengths):
        mask[row, longest - length :] = True
    return batched, mask


def stack_rows(
    views: list[DynamicCache], text_config: PreTrainedConfig, canvas_length: int
) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
    """The decoder's batched inputs: the left-padded cache (``stack_views``), each row's canvas positions (B, C)
    after its own prompt, and the decoder mask (B, L + C) that hides the padding."""
    cache, padding = stack_views(views, text_config)
    device = padding.device
    starts = [view.get_seq_length() for view in views]
    positions = torch.stack(
        [torch.arange(start, start + canvas_length, dtype=torch.int32, device=device) for start in starts]
    )
    canvas = torch.ones((len(views), canvas_length), dtype=torch.bool, device=device)
    return cache, positions, torch.cat([padding, canvas], dim=1)
