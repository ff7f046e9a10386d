"""What the language server imports from the engine, and nothing else does: the wire (``protocol``), the socket's
path and its checks (``socket_paths``), the prompt layouts (``prompt``, rendering a chat template in a child process
with ``template_render``, the ids in ``vocab``), the prompt's budget in lines (``budget``) and the log files
(``logfile``). Torch-free: standard library, attrs and cattrs; these modules import nothing from the rest of the
engine, so the language server stays light (a test holds both)."""
