"""The language server's user features, side by side over one session (``diffgemma_lsp/session.py``): completion,
rewrite selection, next edit, and what rewrite and next edit share (``selection.py``). None imports another; only
``diffgemma_lsp/server.py`` imports them."""
