"""One request, start to end, on the model thread: checked, its prompt ids built, its canvas run, cut at the end
of sequence and decoded (``infill``); compatible requests denoised as the rows of one canvas (``batch``)."""
