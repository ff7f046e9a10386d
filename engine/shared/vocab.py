"""Special tokens of the project's own code tokenizer (the shipped default model uses it).

Ids are fixed so that the model config, the training script and the prompt layout agree.
Checkpoints with another tokenizer (the released DiffusionGemma) are handled in ``diffgemma_engine.shared.prompt``.
"""

from __future__ import annotations

PAD = "<pad>"
EOS = "<eos>"
BOS = "<bos>"
UNK = "<unk>"
FIM_PREFIX = "<fim_prefix>"
FIM_SUFFIX = "<fim_suffix>"
FIM_MIDDLE = "<fim_middle>"
FILE_SEP = "<file_sep>"
# DiffusionGemma always builds a vision tower, whose config needs these ids; code never uses them.
IMAGE = "<image>"
BOI = "<boi>"
EOI = "<eoi>"

SPECIAL_TOKENS: tuple[str, ...] = (
    PAD,
    EOS,
    BOS,
    UNK,
    FIM_PREFIX,
    FIM_SUFFIX,
    FIM_MIDDLE,
    FILE_SEP,
    IMAGE,
    BOI,
    EOI,
)
SPECIAL_IDS: dict[str, int] = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
