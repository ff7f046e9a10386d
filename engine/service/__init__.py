"""The engine's socket side and its model thread: the socket file (``socket_file``), the sessions and dispatch
(``server``, asyncio), the queue between them with latest-wins (``jobs``), the one thread that owns the model
(``worker``), idle shutdown (``idle``) and the figures ``doctor`` reads (``stats``)."""
