"""Context from the whole repository: a tree-sitter index of the workspace's definitions and code windows
(``index``), and what a completion's prompt takes from it (``assembly``)."""
