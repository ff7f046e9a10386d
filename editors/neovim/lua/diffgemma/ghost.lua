-- Ghost text and partial accept.
--
-- Accepting part of a suggestion (the next word, the next line) works on both Neovim versions: through Neovim 0.12's
-- own ghost text (`vim.lsp.inline_completion.get()` with `on_accept`), or through the plugin's own ghost text below
-- (`setup({ ghost_text = true })`, the only one on 0.11, which has none). Either way only the piece is inserted; the
-- editor's next request (the typing) is answered by the server from the suggestion it showed (no new model call),
-- and the plugin's own ghost text shows the rest at once, without waiting for that answer.
--
-- The plugin's own ghost text asks the server's `textDocument/inlineCompletion` as the user types and shows the
-- first item at the cursor: its first line inline, the others as virtual lines. Characters the model was unsure of
-- (the item's `data.confidence` runs, under `unsure_below`) show in `DiffgemmaGhostUnsure`, the rest in
-- `DiffgemmaGhost`.
local position = require("diffgemma.position")

local M = {}

M.ns = vim.api.nvim_create_namespace("diffgemma.ghost")
vim.api.nvim_set_hl(0, "DiffgemmaGhost", { default = true, link = "Comment" })
vim.api.nvim_set_hl(0, "DiffgemmaGhostUnsure", { default = true, link = "NonText" })

--- A character whose confidence is under this shows in DiffgemmaGhostUnsure (setup's opts.unsure_below).
M.unsure_below = 0.5

--- Pieces of a suggestion's text ---------------------------------------------------------------------------------

--- The next word of `text`: its leading whitespace (line breaks included) and then one word (ASCII letters, digits,
--- `_`) or one run of other characters that are not space. (VS Code's acceptNextWord takes leading whitespace as a
--- piece of its own: the plugin takes an indented line's first word with one key.)
function M.next_word(text)
  local space = text:match("^%s*")
  local rest = text:sub(#space + 1)
  return space .. (rest:match("^[%w_]+") or rest:match("^[^%w_%s]+") or "")
end

--- The next line of `text`: the rest of the current line, or when the text goes on from a line break, that break
--- and the line after it.
function M.next_line(text)
  return text:match("^\n[^\n]*") or text:match("^[^\n]*")
end

--- The chunks of each line of `text` for virt_text/virt_lines, unsure characters in their own group. `runs` are the
--- server's [[characters, confidence], ...] over `text`'s characters (nil: all sure).
function M.chunks(text, runs)
  local chars = vim.fn.split(text, "\\zs")
  local groups, at = {}, 1
  for _, run in ipairs(runs or {}) do
    local group = run[2] < M.unsure_below and "DiffgemmaGhostUnsure" or "DiffgemmaGhost"
    for _ = 1, run[1] do
      groups[at], at = group, at + 1
    end
  end
  local lines = { {} }
  for i, char in ipairs(chars) do
    if char == "\n" then
      table.insert(lines, {})
    else
      local line, group = lines[#lines], groups[i] or "DiffgemmaGhost"
      local last = line[#line]
      if last and last[2] == group then
        last[1] = last[1] .. char
      else
        table.insert(line, { char, group })
      end
    end
  end
  for i, line in ipairs(lines) do
    if #line == 0 then
      lines[i] = { { "", "DiffgemmaGhost" } }
    end
  end
  return lines
end

--- Insert `text` at `row`, `col` (0-based, bytes) of `bufnr` and put the cursor after it.
local function insert(bufnr, row, col, text)
  local lines = vim.split(text, "\n", { plain = true })
  vim.api.nvim_buf_set_text(bufnr, row, col, row, col, lines)
  local win = vim.fn.bufwinid(bufnr)
  if win ~= -1 then
    vim.api.nvim_win_set_cursor(win, { row + #lines, (#lines == 1 and col or 0) + #lines[#lines] })
  end
end

--- The plugin's own ghost text (setup's ghost_text) ---------------------------------------------------------------

--- Per buffer, the suggestion shown: { row, col (where its text goes), text, runs, replace_col (nil, or the byte
--- column its whole accept replaces up to) }.
M.shown = {}

--- Hide the buffer's ghost text.
function M.hide(bufnr)
  M.shown[bufnr] = nil
  if vim.api.nvim_buf_is_valid(bufnr) then
    vim.api.nvim_buf_clear_namespace(bufnr, M.ns, 0, -1)
  end
end

local function show(bufnr, shown)
  vim.api.nvim_buf_clear_namespace(bufnr, M.ns, 0, -1)
  M.shown[bufnr] = shown
  local lines = M.chunks(shown.text, shown.runs)
  vim.api.nvim_buf_set_extmark(bufnr, M.ns, shown.row, shown.col, {
    virt_text = lines[1],
    virt_text_pos = shown.replace_col and "overlay" or "inline",
    virt_lines = { unpack(lines, 2) },
    hl_mode = "combine",
  })
end

--- The runs of `runs` after its first `skip` characters.
local function drop_runs(runs, skip)
  if not runs then
    return nil
  end
  local out = {}
  for _, run in ipairs(runs) do
    local cut = math.min(skip, run[1])
    skip = skip - cut
    if run[1] > cut then
      table.insert(out, { run[1] - cut, run[2] })
    end
  end
  return out
end

--- The shown suggestion still in front of the cursor: what was typed since it was shown (on its line) is its start.
--- Returns the cursor's row and column and the shown text's part not typed yet, or nil.
local function ahead(bufnr)
  local shown = M.shown[bufnr]
  local win = vim.fn.bufwinid(bufnr)
  if not shown or win == -1 then
    return nil
  end
  local row, col = unpack(vim.api.nvim_win_get_cursor(win))
  row = row - 1
  if row ~= shown.row or col < shown.col then
    return nil
  end
  local typed = vim.api.nvim_buf_get_text(bufnr, row, shown.col, row, col, {})[1]
  if shown.text:sub(1, #typed) ~= typed then
    return nil
  end
  return row, col, shown.text:sub(#typed + 1), #vim.fn.split(typed, "\\zs")
end

--- Keep showing the rest of the suggestion the user typed into; hide it when the typing left it.
local function follow(bufnr)
  local shown = M.shown[bufnr]
  local row, col, rest, typed = ahead(bufnr)
  if not row or rest == "" then
    M.hide(bufnr)
  elseif typed > 0 then
    show(bufnr, { row = row, col = col, text = rest, runs = drop_runs(shown.runs, typed), replace_col = nil })
  end
end

--- Take the next piece ("word", "line") or all ("all") of the plugin's own ghost text; false when none is shown.
local function take_own(bufnr, kind)
  local shown = M.shown[bufnr]
  local row, col, rest, typed = ahead(bufnr)
  if not row or rest == "" then
    return false
  end
  local piece = kind == "word" and M.next_word(rest) or kind == "line" and M.next_line(rest) or rest
  if piece == rest and shown.replace_col and typed == 0 then -- the whole of it: the closers it replaces go
    vim.api.nvim_buf_set_text(bufnr, row, col, row, shown.replace_col, {})
  end
  insert(bufnr, row, col, piece)
  local runs = drop_runs(shown.runs, typed + #vim.fn.split(piece, "\\zs"))
  M.hide(bufnr)
  if piece ~= rest then
    local new_row, new_col = unpack(vim.api.nvim_win_get_cursor(0))
    show(bufnr, { row = new_row - 1, col = new_col, text = rest:sub(#piece + 1), runs = runs })
  end
  return true
end

--- Ask the server for ghost text at the cursor of `bufnr` (automatic: it debounces), then show it.
local function request(bufnr, state)
  local client = vim.lsp.get_clients({ bufnr = bufnr, name = "diffgemma" })[1]
  if not client then
    return
  end
  if state.pending then
    client:cancel_request(state.pending)
  end
  local row, col = unpack(vim.api.nvim_win_get_cursor(0))
  local tick = vim.b[bufnr].changedtick
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(bufnr) },
    position = position.lsp_position(bufnr, row - 1, col, client.offset_encoding),
    context = { triggerKind = 2 }, -- Automatic
  }
  local _, id
  _, id = client:request("textDocument/inlineCompletion", params, function(err, result)
    if state.pending == id then
      state.pending = nil
    end
    local item = not err and result and (result.items or result)[1]
    local fresh = vim.api.nvim_buf_is_valid(bufnr) and vim.b[bufnr].changedtick == tick
    if not fresh or vim.api.nvim_get_mode().mode:sub(1, 1) ~= "i" then
      return
    end
    local text = item and type(item.insertText) == "string" and item.insertText or ""
    if text == "" then
      return M.hide(bufnr)
    end
    local replace_col = nil
    if item.range and item.range["end"].character ~= item.range.start.character then
      replace_col = position.byte_col(bufnr, item.range["end"], client.offset_encoding)
    end
    local runs = type(item.data) == "table" and item.data.confidence or nil
    show(bufnr, { row = row - 1, col = col, text = text, runs = runs, replace_col = replace_col })
  end, bufnr)
  state.pending = id
end

--- Per buffer where the plugin's own ghost text is on: { pending = the id of its request in flight }.
M.state = {}

--- Show the plugin's own ghost text in `bufnr` while in insert mode.
function M.attach(bufnr)
  local state = {}
  M.state[bufnr] = state
  local group = vim.api.nvim_create_augroup("diffgemma.ghost." .. bufnr, { clear = true })
  vim.api.nvim_create_autocmd("InsertEnter", {
    group = group,
    buffer = bufnr,
    callback = function() vim.schedule(function() request(bufnr, state) end) end, -- the cursor where typing starts
  })
  vim.api.nvim_create_autocmd("TextChangedI", {
    group = group,
    buffer = bufnr,
    callback = function()
      follow(bufnr)
      request(bufnr, state)
    end,
  })
  vim.api.nvim_create_autocmd({ "InsertLeave", "BufLeave" }, {
    group = group,
    buffer = bufnr,
    callback = function()
      local client = vim.lsp.get_clients({ bufnr = bufnr, name = "diffgemma" })[1]
      if client and state.pending then
        client:cancel_request(state.pending)
        state.pending = nil
      end
      M.hide(bufnr)
    end,
  })
end

--- Neovim 0.12+'s own ghost text ---------------------------------------------------------------------------------

--- Take the next piece of the ghost text Neovim shows (0.12+): the item's text less what was typed since it was
--- asked for; false when none is shown.
local function take_builtin(bufnr, kind)
  return vim.lsp.inline_completion.get({
    bufnr = bufnr,
    on_accept = function(item)
      if kind == "all" then
        return item
      end
      local text = type(item.insert_text) == "string" and item.insert_text or item.insert_text.value
      local row, col = unpack(vim.api.nvim_win_get_cursor(0))
      local start_row, start_col = row - 1, col
      if item.range then
        start_row, start_col = item.range:to_extmark()
      end
      if start_row ~= row - 1 or start_col > col then
        return nil
      end
      local typed = vim.api.nvim_buf_get_text(bufnr, start_row, start_col, start_row, col, {})[1]
      if text:sub(1, #typed) == typed then
        local rest = text:sub(#typed + 1)
        insert(bufnr, row - 1, col, kind == "word" and M.next_word(rest) or M.next_line(rest))
      end
      return nil -- inserted here (or nothing fits any more)
    end,
  })
end

--- Accept the next word ("word"), the next line ("line") or all ("all") of the suggestion shown in `bufnr`; false
--- when none is shown (a mapping then gives the key its own meaning).
function M.accept(bufnr, kind)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  if M.state[bufnr] then
    return take_own(bufnr, kind)
  end
  if vim.lsp.inline_completion then
    return take_builtin(bufnr, kind)
  end
  return false
end

return M
