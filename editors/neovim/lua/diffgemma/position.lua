-- Positions between Neovim (0-based rows, byte columns) and LSP (lines, characters in the client's encoding).
local M = {}

--- An LSP position for byte column `col` (0-based) of line `row` (0-based), in the client's position encoding.
function M.lsp_position(bufnr, row, col, encoding)
  local line = vim.api.nvim_buf_get_lines(bufnr, row, row + 1, true)[1]
  col = math.max(0, math.min(col, #line))
  return { line = row, character = vim.str_utfindex(line, encoding, col, false) }
end

--- The byte column (0-based) of LSP position `position` in `bufnr`, in the client's position encoding.
function M.byte_col(bufnr, position, encoding)
  local line = vim.api.nvim_buf_get_lines(bufnr, position.line, position.line + 1, false)[1] or ""
  return vim.str_byteindex(line, encoding, math.min(position.character, vim.str_utfindex(line, encoding)), false)
end

return M
