"""The denoising maths: tensors only; no socket, queue or wire type.

Its modules stand in layers, each importing only those below it::

    warmup.py -> denoise.py -> step.py -> caches.py | sampler.py

``sampler`` scores a step's logits and draws the accepted tokens, ``caches`` encodes prompts and builds the
decoder's caches, ``step`` runs one decoder pass (eager, or compiled once warmed up), ``denoise`` runs the loop
over one canvas, and ``warmup`` traces the shapes serving uses so that the compiled step covers them. A canvas
hands back token ids; turning them into text is ``engine.infill``'s job.
"""
