"""Which weights a quantizer converts, and which stay in bfloat16: one list, for the memory plan and the quantizer.

Pure (standard library only), by parameter name, so it applies to a model on the meta device, to a state dict and
to a checkpoint's index alike. Converted: the routed experts' fused 3-D tensors (``experts.gate_up_proj``,
``experts.down_proj``: 88% of DiffusionGemma-26B-A4B's weights) and the weight matrices of the text stack's
``nn.Linear`` layers (attention, dense MLP, self-conditioning). Kept: what is small, or what quality is sensitive to
and a quantizer's kernels rarely cover:

* the token embedding and the LM head (tied to it: one tensor, read by index and by a matmul);
* the MoE router (``router.proj``, ``router.scale``, ``router.per_expert_scale``): a few MB, and the expert choice
  moves with its precision;
* every norm, bias and scalar (``layer_scalar``, clipping bounds);
* the vision tower and the multimodal embedder (2% of the weights, never run for code), and their audio siblings
  in Gemma 4 checkpoints that have them.

The encoder and the decoder share every text weight, so either name of a tied tensor gets the same answer.
"""

from __future__ import annotations

MULTIMODAL_MODULES: tuple[str, ...] = ("vision_tower", "embed_vision", "audio_tower", "embed_audio")
"""The towers and the embedders that project their output into the text stack (Gemma 4's vision block)."""
UNQUANTIZED_MODULES: tuple[str, ...] = ("embed_tokens", "lm_head", "router", *MULTIMODAL_MODULES)
"""Module names (one dotted component of a parameter's name) whose parameters all stay bfloat16; also usable as a
transformers quantizer's ``modules_to_not_convert``, with norms added (their names contain ``norm``)."""
EXPERT_WEIGHTS: tuple[str, ...] = ("gate_up_proj", "down_proj")
"""The fused expert tensors' own names, directly under an ``experts`` module (not ``nn.Linear`` layers)."""


def stays_unquantized(name: str) -> bool:
    """True for a parameter (or buffer) that a quantizer leaves in bfloat16, False for one it converts.

    Converted are only matrix weights: a ``….weight`` outside the skipped modules and norms, or an expert tensor
    ``….experts.gate_up_proj`` / ``….experts.down_proj``; biases, scales and other leaves stay.
    """
    parts = name.split(".")
    if any(part in UNQUANTIZED_MODULES or "norm" in part for part in parts[:-1]):
        return True
    leaf = parts[-1]
    if leaf in EXPERT_WEIGHTS and len(parts) >= 2 and parts[-2] == "experts":
        return False
    return leaf != "weight"
