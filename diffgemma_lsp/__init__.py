"""diffgemma-lsp: local multi-line code completion from DiffusionGemma."""

__version__ = "0.1.0"
