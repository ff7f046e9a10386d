-- require("diffgemma").setup(opts): diffgemma-lsp in Neovim 0.11+.
--
-- opts.cmd          the server command (default: { "diffgemma-lsp", "--stdio" })
-- opts.filetypes    where it runs (default: the list in lsp/diffgemma.lua, next to this plugin)
-- opts.settings     init_options, camelCase: { model = "...", device = "cuda", debounceMs = 75, ... }
-- opts.autotrigger  ask for completions on the server's trigger characters (default: true)
-- opts.accept_key   Neovim 0.12+: insert-mode key that accepts the ghost text (default: "<Tab>")
local M = {}

function M.setup(opts)
  opts = opts or {}
  vim.lsp.config("diffgemma", {
    cmd = opts.cmd or { "diffgemma-lsp", "--stdio" },
    filetypes = opts.filetypes, -- nil: keep lsp/diffgemma.lua's list
    root_markers = { ".git" },
    init_options = opts.settings or {},
  })
  vim.lsp.enable("diffgemma")

  local accept_key = opts.accept_key or "<Tab>"
  vim.api.nvim_create_autocmd("LspAttach", {
    group = vim.api.nvim_create_augroup("diffgemma", { clear = true }),
    callback = function(args)
      local client = vim.lsp.get_client_by_id(args.data.client_id)
      if not client or client.name ~= "diffgemma" then
        return
      end
      local bufnr = args.buf
      vim.lsp.completion.enable(true, client.id, bufnr, { autotrigger = opts.autotrigger ~= false })
      -- Without "menuone", nvim inserts a lone item's label and never expands its multi-line snippet.
      local cot = vim.bo[bufnr].completeopt ~= "" and vim.bo[bufnr].completeopt or vim.go.completeopt
      if not cot:find("menuone") then
        vim.bo[bufnr].completeopt = cot .. ",menuone"
      end
      if vim.lsp.inline_completion then -- Neovim 0.12+: ghost text
        vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
        vim.keymap.set("i", accept_key, function()
          if not vim.lsp.inline_completion.get() then
            return accept_key
          end
        end, { buffer = bufnr, expr = true, desc = "diffgemma: accept the suggestion" })
      end
    end,
  })
end

return M
