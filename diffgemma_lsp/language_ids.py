"""Editors' names for languages mapped onto LSP's language ids, so every editor gets each language's rules.

The LSP specification lists the ids a client should send (``csharp``, ``cuda-cpp``, ``typescriptreact``); VS Code
sends them. Neovim sends its filetype (``cs``, ``cuda``, ``objc``), Helix its language name (``c-sharp``, ``tsx``)
unless ``language-id`` is set, and other clients their display names (``C#``, ``C++``). Without this map those
documents fell back to indentation rules in post-processing and to an unusual fence in the chat prompt.
"""

from __future__ import annotations

EDITOR_LANGUAGE_IDS: dict[str, str] = {
    # Neovim filetypes
    "cs": "csharp",
    "cuda": "cuda-cpp",
    "objc": "objective-c",
    "objcpp": "objective-cpp",
    "sh": "shellscript",
    "bash": "shellscript",
    "zsh": "shellscript",
    # Helix language names
    "c-sharp": "csharp",
    "tsx": "typescriptreact",
    "jsx": "javascriptreact",
    "bash-script": "shellscript",
    # display names (Zed, Sublime, others)
    "c#": "csharp",
    "c++": "cpp",
    "objective-c++": "objective-cpp",
    "golang": "go",
    "js": "javascript",
    "ts": "typescript",
}
"""An editor's id (lower case) -> LSP's id; ids LSP already uses are not listed."""


def lsp_language_id(editor_id: str) -> str:
    """LSP's language id for what an editor sent: lower case, mapped through :data:`EDITOR_LANGUAGE_IDS`."""
    lowered = editor_id.strip().lower()
    return EDITOR_LANGUAGE_IDS.get(lowered, lowered)
