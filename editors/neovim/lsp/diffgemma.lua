-- diffgemma-lsp: multi-line code completion from a local DiffusionGemma model.
-- A Neovim 0.11+ LSP config: put this file at <runtimepath>/lsp/diffgemma.lua, then `vim.lsp.enable("diffgemma")`.
-- Settings (camelCase) go in init_options, as in the top-level README's table: enable, model, device,
-- quantization, runtime, vllmCommand, stepMode,
-- engineIdleExitMinutes, canvasLength, steps, refineSteps, contextTokens, extraContextTokens, editHistoryTokens,
-- repoContextTokens, debounceMs, deadlineMs, candidates, minConfidence, backend, openaiUrl, openaiModel, openaiApiKeyEnv, openaiPromptFormat, rewriteEnabled,
-- rewriteStrength, rewriteSteps, nextEditEnabled, nextEditLines, nextEditOnPause, nextEditStrength, nextEditDraws,
-- privateFiles.
return {
  cmd = { "diffgemma-lsp", "--stdio" },
  filetypes = {
    "c", "cpp", "cs", "cuda", "go", "haskell", "java", "javascript", "javascriptreact", "julia", "kotlin",
    "lua", "ocaml", "php", "python", "r", "ruby", "rust", "scala", "sh", "bash", "zsh", "sql", "swift",
    "typescript", "typescriptreact", "vim", "zig",
  },
  root_markers = { ".git" },
  init_options = vim.empty_dict(), -- an empty {} would go as a JSON array
}
