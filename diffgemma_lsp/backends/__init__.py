"""Where completions come from: the local engine over its socket, or an OpenAI-compatible server over HTTP."""
