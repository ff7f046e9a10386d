-- require("diffgemma").setup(opts): diffgemma-lsp in Neovim 0.11+.
--
-- opts.cmd          the server command (default: { "diffgemma-lsp", "--stdio" })
-- opts.filetypes    where it runs (default: the list in lsp/diffgemma.lua, next to this plugin)
-- opts.settings     init_options, camelCase: { model = "...", device = "cuda", debounceMs = 75, ... }
-- opts.autotrigger  ask for completions on the server's trigger characters (default: true)
-- opts.accept_key   insert-mode key that accepts the ghost text (default: "<Tab>")
-- opts.accept_word_key, opts.accept_line_key
--                   insert-mode keys that accept the ghost text's next word / next line (defaults: "<M-Right>",
--                   "<M-C-Right>", copilot.vim's; false: no mapping). The rest stays shown.
-- opts.ghost_text   show suggestions as the plugin's own ghost text (diffgemma/ghost.lua) as you type, the part the
--                   model is unsure of dimmer; the menu then opens only when asked (<C-Space>) unless opts.autotrigger
--                   is true (default: false: Neovim 0.12+ shows its own ghost text, 0.11 the menu only)
-- opts.unsure_below the plugin's ghost text shows characters the model was less sure of than this (0 to 1) in
--                   DiffgemmaGhostUnsure (default: 0.5)
-- opts.next_edit    next edits: ask after each insert (InsertLeave) and normal-mode change, debounced (default: true)
--
-- Next edits (the server's diffgemma/nextEdit): `require("diffgemma").next_edit()` asks at the cursor (setup() asks
-- by itself after an edit, unless opts.next_edit is false); the suggestion shows as extmarks, the lines it replaces
-- struck through and the new ones as virtual lines below them. <Tab> in normal mode applies it (one undo step),
-- <Esc> dismisses it; any change to the buffer dismisses it too. A suggestion away from the cursor (the server's
-- `jump`: the next place of a chain, such as the other uses of a renamed name) also shows at the cursor as a hint,
-- "Tab: line N"; <Tab> jumps there and applies it, and the plugin asks for the next place at once.
--
-- Rewrite selection: the server's code action comes through `vim.lsp.buf.code_action()` as it is. With an
-- instruction: `require("diffgemma").rewrite()` from a visual-mode mapping, or `:'<,'>DiffgemmaRewrite [instruction]`
-- (setup() defines it); without an instruction on the command line, both ask for one with `vim.ui.input`.
local M = {}

--- The server's command: its code action "Rewrite selection" runs it too.
M.REWRITE_COMMAND = "diffgemma.rewriteSelection"

local ghost = require("diffgemma.ghost")
local lsp_position = require("diffgemma.position").lsp_position

--- The LSP range of a visual region: `first` and `last` are getpos() results (1-based rows and byte columns, in
--- either order), `mode` is "v" (charwise, `last`'s character included unless 'selection' is exclusive), or "V" or
--- CTRL-V (whole lines: from the first line's start to the last line's end, its line break left out).
function M.region_range(bufnr, first, last, mode, encoding)
  local srow, scol, erow, ecol = first[2], first[3], last[2], last[3]
  if erow < srow or (erow == srow and ecol < scol) then
    srow, scol, erow, ecol = erow, ecol, srow, scol
  end
  local last_line = vim.api.nvim_buf_get_lines(bufnr, erow - 1, erow, true)[1]
  local start_col, end_col
  if mode == "v" then
    start_col = scol - 1
    end_col = math.min(ecol - 1, #last_line)
    if vim.o.selection ~= "exclusive" then
      end_col = end_col + #vim.fn.strpart(last_line, end_col, 1, true) -- the whole last character
    end
  else
    start_col, end_col = 0, #last_line
  end
  return {
    start = lsp_position(bufnr, srow - 1, start_col, encoding),
    ["end"] = lsp_position(bufnr, erow - 1, end_col, encoding),
  }
end

--- The current selection's range: the visual region when in visual mode (then visual mode ends), else the last one
--- ('< and '>) when `line1`/`line2` (a command's range) are its lines, else those whole lines. nil without any.
local function selection_range(bufnr, encoding, line1, line2)
  local mode = vim.api.nvim_get_mode().mode
  local visual = mode:sub(1, 1)
  if visual == "v" or visual == "V" or visual == "\22" then
    local range = M.region_range(bufnr, vim.fn.getpos("v"), vim.fn.getpos("."), visual, encoding)
    -- :normal keeps what is still to be typed (the feedkeys "x" flag would run it all now).
    vim.cmd("normal! " .. vim.keycode("<Esc>"))
    return range
  end
  if not line1 then
    return nil
  end
  local first, last = vim.fn.getpos("'<"), vim.fn.getpos("'>")
  if first[2] == line1 and last[2] == line2 then
    return M.region_range(bufnr, first, last, vim.fn.visualmode(), encoding)
  end
  return M.region_range(bufnr, { 0, line1, 1, 0 }, { 0, line2, 1, 0 }, "V", encoding)
end

--- Rewrite the selection with the server's `diffgemma.rewriteSelection` (the server shows progress and applies the
--- edit, one undo step; it refuses when the buffer changed meanwhile).
--- opts.instruction  what to do with the selection (nil: ask with vim.ui.input; "" : no instruction)
--- opts.range        an LSP range (default: the visual selection, or opts.line1/line2 from a command)
--- opts.bufnr        default: the current buffer
--- opts.on_done      function(err, result) with the command's answer {applied, reason}
function M.rewrite(opts)
  opts = opts or {}
  local bufnr = opts.bufnr or vim.api.nvim_get_current_buf()
  local client = vim.lsp.get_clients({ bufnr = bufnr, name = "diffgemma" })[1]
  if not client then
    vim.notify("diffgemma: the language server is not attached to this buffer", vim.log.levels.WARN)
    return
  end
  local range = opts.range or selection_range(bufnr, client.offset_encoding, opts.line1, opts.line2)
  if not range or (range.start.line == range["end"].line and range.start.character == range["end"].character) then
    vim.notify("diffgemma: select the code to rewrite first", vim.log.levels.INFO)
    return
  end
  -- Read before the prompt: an edit made while it is open makes the server refuse the stale rewrite.
  local argument = { uri = vim.uri_from_bufnr(bufnr), range = range, version = vim.lsp.util.buf_versions[bufnr] }
  local function run(instruction)
    if instruction == nil then
      return -- cancelled
    end
    instruction = vim.trim(instruction)
    if instruction ~= "" then
      argument.instruction = instruction
    end
    local command = { title = "Rewrite selection", command = M.REWRITE_COMMAND, arguments = { argument } }
    client:exec_cmd(command, { bufnr = bufnr }, function(err, result)
      if err then
        vim.notify("diffgemma: the rewrite failed: " .. (err.message or vim.inspect(err)), vim.log.levels.ERROR)
      end
      if opts.on_done then
        opts.on_done(err, result)
      end
    end)
  end
  if opts.instruction ~= nil then
    run(opts.instruction)
  else
    vim.ui.input({ prompt = "Rewrite instruction (empty: re-fill): " }, run)
  end
end

--- Next edits ------------------------------------------------------------------------------------------------------

M.NEXT_EDIT_METHOD = "diffgemma/nextEdit"
local next_ns = vim.api.nvim_create_namespace("diffgemma.next_edit")
vim.api.nvim_set_hl(0, "DiffgemmaNextEditDelete", { default = true, strikethrough = true, link = "DiffDelete" })
vim.api.nvim_set_hl(0, "DiffgemmaNextEditAdd", { default = true, link = "DiffAdd" })
vim.api.nvim_set_hl(0, "DiffgemmaNextEditJump", { default = true, link = "Comment" })
--- Per buffer, the suggestion shown: { version, edits, encoding, jump }.
M.shown = {}

--- Clear the suggestion shown in `bufnr`.
function M.dismiss(bufnr)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  M.shown[bufnr] = nil
  if vim.api.nvim_buf_is_valid(bufnr) then
    vim.api.nvim_buf_clear_namespace(bufnr, next_ns, 0, -1)
  end
end

--- The suggestion's edits as extmarks: each replaced line struck through, the new lines as virtual lines after
--- them (before the next line for a pure insertion).
local function show(bufnr, edits)
  local count = vim.api.nvim_buf_line_count(bufnr)
  for _, edit in ipairs(edits) do
    local first, after = edit.range.start.line, edit.range["end"].line
    for row = first, math.min(after, count) - 1 do
      local line = vim.api.nvim_buf_get_lines(bufnr, row, row + 1, true)[1]
      vim.api.nvim_buf_set_extmark(bufnr, next_ns, row, 0, { end_col = #line, hl_group = "DiffgemmaNextEditDelete" })
    end
    local added = vim.split(edit.newText, "\n", { plain = true })
    if added[#added] == "" then
      table.remove(added)
    end
    if #added > 0 then
      local virt_lines = vim.tbl_map(function(text) return { { text, "DiffgemmaNextEditAdd" } } end, added)
      if after > first then
        vim.api.nvim_buf_set_extmark(bufnr, next_ns, math.min(after, count) - 1, 0, { virt_lines = virt_lines })
      elseif first < count then
        vim.api.nvim_buf_set_extmark(bufnr, next_ns, first, 0, { virt_lines = virt_lines, virt_lines_above = true })
      else
        vim.api.nvim_buf_set_extmark(bufnr, next_ns, count - 1, 0, { virt_lines = virt_lines })
      end
    end
  end
end

--- Ask the server for the next edit at the cursor and show it.
--- opts.bufnr    default: the current buffer
--- opts.on_done  function(result) with the server's answer (nil: no edit)
--- Returns the client and the request's id (nil when no client is attached), for client:cancel_request().
function M.next_edit(opts)
  opts = opts or {}
  local bufnr = opts.bufnr or vim.api.nvim_get_current_buf()
  local client = vim.lsp.get_clients({ bufnr = bufnr, name = "diffgemma" })[1]
  if not client then
    return
  end
  local row, col = unpack(vim.api.nvim_win_get_cursor(0))
  local version = vim.lsp.util.buf_versions[bufnr]
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(bufnr), version = version },
    position = lsp_position(bufnr, row - 1, col, client.offset_encoding),
  }
  local _, request_id = client:request(M.NEXT_EDIT_METHOD, params, function(err, result)
    if err then
      vim.notify("diffgemma: next edit failed: " .. (err.message or vim.inspect(err)), vim.log.levels.WARN)
    end
    local fresh = result and result ~= vim.NIL and result.version == vim.lsp.util.buf_versions[bufnr]
    if fresh then
      M.dismiss(bufnr)
      local jump = result.jump == true
      M.shown[bufnr] = { version = result.version, edits = result.edits, encoding = client.offset_encoding, jump = jump }
      show(bufnr, result.edits)
      if jump and #result.edits > 0 then -- where Tab goes, said where the user is
        local target = result.edits[1].range.start.line
        vim.api.nvim_buf_set_extmark(bufnr, next_ns, row - 1, 0, {
          virt_text = { { string.format("  Tab: line %d", target + 1), "DiffgemmaNextEditJump" } },
        })
      end
    end
    if opts.on_done then
      opts.on_done(fresh and result or nil)
    end
  end, bufnr)
  return client, request_id
end

--- Apply the suggestion shown in `bufnr` (one undo step); false when there is none for the buffer as it is.
function M.accept_next_edit(bufnr)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  local shown = M.shown[bufnr]
  if not shown or shown.version ~= vim.lsp.util.buf_versions[bufnr] then
    M.dismiss(bufnr)
    return false
  end
  M.dismiss(bufnr)
  vim.lsp.util.apply_text_edits(shown.edits, bufnr, shown.encoding)
  if shown.jump and vim.api.nvim_get_current_buf() == bufnr then -- the cursor follows to the place edited
    local target = math.min(shown.edits[1].range.start.line + 1, vim.api.nvim_buf_line_count(bufnr))
    vim.api.nvim_win_set_cursor(0, { target, 0 })
  end
  return true
end

--- Whether the user is typing: insert or replace mode, or a completion menu open. The plugin asks for no next edit
--- then: its request would compete in the engine with the completion the user is waiting for.
local function typing()
  local mode = vim.api.nvim_get_mode().mode
  return mode:find("^[iR]") ~= nil or vim.fn.pumvisible() == 1
end

local function watch_next_edits(bufnr, accept_key)
  local group = vim.api.nvim_create_augroup("diffgemma.next_edit." .. bufnr, { clear = true })
  local timer = nil
  local pending = nil -- the client and id of the next-edit request in flight
  local function stop()
    if timer then
      timer:stop()
      timer = nil
    end
    if pending then
      pending.client:cancel_request(pending.id)
      pending = nil
    end
  end
  local function ask_soon()
    stop()
    timer = vim.defer_fn(function()
      timer = nil
      if vim.api.nvim_buf_is_valid(bufnr) and vim.api.nvim_get_current_buf() == bufnr and not typing() then
        local request = {}
        request.client, request.id = M.next_edit({
          bufnr = bufnr,
          on_done = function()
            if pending == request then
              pending = nil
            end
          end,
        })
        pending = request.client and request or nil -- no client attached: nothing was sent
      end
    end, 300)
  end
  vim.api.nvim_create_autocmd({ "TextChanged", "TextChangedI" }, {
    group = group,
    buffer = bufnr,
    callback = function() M.dismiss(bufnr) end, -- what it was computed for is gone
  })
  vim.api.nvim_create_autocmd({ "InsertLeave", "TextChanged" }, { group = group, buffer = bufnr, callback = ask_soon })
  -- Back to typing: the next edit asked for the text as it was would only delay the completions to come.
  vim.api.nvim_create_autocmd("InsertEnter", { group = group, buffer = bufnr, callback = stop })
  -- Not expr mappings: those may not change the text (textlock). A key that falls back to its own meaning goes to
  -- the front of the typeahead ("i"): keys typed after it (a mapping's, a macro's, a paste's) run after it.
  vim.keymap.set("n", accept_key, function()
    if not M.accept_next_edit(bufnr) then
      vim.api.nvim_feedkeys(vim.keycode(accept_key), "ni", false) -- the key's own meaning
    end
  end, { buffer = bufnr, desc = "diffgemma: apply the suggested edit" })
  vim.keymap.set("n", "<Esc>", function()
    if M.shown[bufnr] then
      M.dismiss(bufnr)
    else
      vim.api.nvim_feedkeys(vim.keycode("<Esc>"), "ni", false)
    end
  end, { buffer = bufnr, desc = "diffgemma: dismiss the suggested edit" })
end

--- The options the completion menu needs (added to the buffer's own 'completeopt'): "menuone", so that a lone item
--- shows and a snippet is expanded on accept; "noselect", so that a menu that opens while the user types
--- (autotrigger) changes nothing until they pick an item (<C-n>, then <C-y>). Not "noinsert": with it, an <Enter>
--- typed just after a menu opened closes the menu and the line break is lost (Neovim 0.11 and 0.12).
M.COMPLETEOPT = { "menuone", "noselect" }

--- Map insert-mode `key` (false: none) in `bufnr` to accept `kind` ("all", "word", "line") of the ghost text, or
--- to type the key's own meaning when none is shown. Not an expr mapping: those may not change the text.
local function accept_mapping(bufnr, key, kind)
  if not key then
    return
  end
  vim.keymap.set("i", key, function()
    if not ghost.accept(bufnr, kind) then
      vim.api.nvim_feedkeys(vim.keycode(key), "ni", false)
    end
  end, { buffer = bufnr, desc = "diffgemma: accept the suggestion's " .. (kind == "all" and "whole text" or "next " .. kind) })
end

function M.setup(opts)
  opts = opts or {}
  vim.lsp.config("diffgemma", {
    cmd = opts.cmd or { "diffgemma-lsp", "--stdio" },
    filetypes = opts.filetypes, -- nil: keep lsp/diffgemma.lua's list
    root_markers = { ".git" },
    -- An empty Lua table is sent as a JSON array; settings are an object.
    init_options = (opts.settings and next(opts.settings)) and opts.settings or vim.empty_dict(),
  })
  vim.lsp.enable("diffgemma")

  vim.api.nvim_create_user_command("DiffgemmaRewrite", function(args)
    M.rewrite({
      line1 = args.range > 0 and args.line1 or nil,
      line2 = args.range > 0 and args.line2 or nil,
      instruction = args.args ~= "" and args.args or nil,
    })
  end, { range = true, nargs = "*", desc = "diffgemma: rewrite the selection (with an instruction)" })

  local accept_key = opts.accept_key or "<Tab>"
  local own_ghost = opts.ghost_text == true
  local autotrigger = opts.autotrigger
  if autotrigger == nil then
    autotrigger = not own_ghost -- ghost text as you type, the menu when asked
  end
  ghost.unsure_below = opts.unsure_below or ghost.unsure_below
  vim.api.nvim_create_autocmd("LspAttach", {
    group = vim.api.nvim_create_augroup("diffgemma", { clear = true }),
    callback = function(args)
      local client = vim.lsp.get_client_by_id(args.data.client_id)
      if not client or client.name ~= "diffgemma" then
        return
      end
      local bufnr = args.buf
      vim.lsp.completion.enable(true, client.id, bufnr, { autotrigger = autotrigger })
      local cot = vim.bo[bufnr].completeopt ~= "" and vim.bo[bufnr].completeopt or vim.go.completeopt
      cot = vim.split(cot, ",", { trimempty = true })
      for _, option in ipairs(M.COMPLETEOPT) do
        if not vim.list_contains(cot, option) then
          table.insert(cot, option)
        end
      end
      vim.bo[bufnr].completeopt = table.concat(cot, ",")
      if opts.next_edit ~= false then
        watch_next_edits(bufnr, accept_key)
      end
      if own_ghost then
        ghost.attach(bufnr)
        accept_mapping(bufnr, accept_key, "all")
      elseif vim.lsp.inline_completion then -- Neovim 0.12+: its own ghost text
        vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
        vim.keymap.set("i", accept_key, function()
          if not vim.lsp.inline_completion.get() then
            return accept_key
          end
        end, { buffer = bufnr, expr = true, desc = "diffgemma: accept the suggestion" })
      end
      if vim.lsp.inline_completion or own_ghost then
        accept_mapping(bufnr, opts.accept_word_key == nil and "<M-Right>" or opts.accept_word_key, "word")
        accept_mapping(bufnr, opts.accept_line_key == nil and "<M-C-Right>" or opts.accept_line_key, "line")
      end
    end,
  })
end

return M
