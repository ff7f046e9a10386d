"""The resident model process: it holds a DiffusionGemma model and serves infill requests on a Unix socket.

The folder ``engine/`` installs as the package ``diffgemma_engine`` (``package-dir`` in pyproject.toml), and its
modules import each other relatively. Importing the folder as ``engine`` (from the repository root) would load a
second copy of every module beside the installed one, whose classes fail ``isinstance`` checks against the first,
so that name is refused.
"""

if __name__ != "diffgemma_engine":
    raise ImportError(f"import diffgemma_engine, not {__name__}: the folder engine/ installs under that name")
