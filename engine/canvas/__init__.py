"""The denoising maths: tensors only; no socket, queue or wire type.

Its modules stand in layers, each importing only those below it::

    warmup.py | captured.py -> denoise.py | static.py -> compiled.py -> loop.py -> step.py
        -> caches.py | sampler.py | start.py

``step`` states the denoising step once (``denoise_step``); ``sampler`` holds its named pieces (scores, acceptance,
the exact and fast samplers, the stopper) and ``start`` where a canvas starts. ``loop`` is the one host loop around
the step. Three ways run it: eagerly (``denoise``), with the decoder pass compiled (``compiled``, traced by
``warmup`` on the shapes serving uses), and as one graph per serving shape on fixed buffers (``static``,
``captured``). ``caches`` encodes prompts and builds the decoder's caches. A canvas hands back token ids; turning
them into text is ``diffgemma_engine.request.infill``'s job.
"""
