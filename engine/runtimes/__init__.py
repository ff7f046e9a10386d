"""What runs the canvases, behind one seam (``seam.CanvasRuntime``): the engine's own loop (``own_loop``) or a vLLM
server (``vllm_server``). The model thread (``diffgemma_engine.service.worker``) takes one and does not ask which; a
third runtime is one more module here."""
