"""From a folder or a hub id to a model ready to serve: the folder's checks (``checkpoint_files``, ``folder_limits``,
``generation_limits``, ``shards``, ``loadable``), the hub cache (``hub``), the memory plan (``plan``), placement on
the devices (``placement``), quantization (``quantize``, ``quantize_policy``, ``quantize_check``), the text-only
model (``text_only``), and ``model``, which loads it and holds the checkpoint's facts with their serving state."""
