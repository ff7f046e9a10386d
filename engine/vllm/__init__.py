"""The vLLM runtime: on NVIDIA cards the engine hands its canvases to a vLLM server, which serves DiffusionGemma
near the GPU's memory-bandwidth floor (CUDA graphs, FP8 and 4-bit checkpoints, tensor parallelism, prefix caching).

The engine keeps what is its own (the socket, the queue with latest-wins, the prompt layouts with a stable head,
answers, rewrites, stats): ``completions`` states each request as vLLM's ``/v1/completions`` takes it, from the ids
the engine's own layout builds. Pure: attrs only, no torch and no vLLM (which lives in its own environment)."""
