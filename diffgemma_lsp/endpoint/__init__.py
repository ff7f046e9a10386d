"""``diffgemma-lsp openai``: an OpenAI-compatible ``/v1/completions`` endpoint in front of the engine."""
