// End-to-end driver: a real VS Code (code-server) in headless Chromium, worked the way a user does, with the
// packaged extension installed and the real diffgemma-lsp and engine behind it. tests/e2e/test_vscode.py starts
// code-server, runs this script with its configuration in $DIFFGEMMA_E2E (JSON), and asserts on the JSON report
// this script writes. The script never throws past main(): every failure ends in the report.
//
// Steps: open the workspace, wait for the extension's status bar item, open the file at cfg.line (and cfg.column,
// default 1), wait until the status bar says the engine is ready; then by cfg.scenario:
// - "inline" (the default): trigger an inline suggestion, read the ghost text, press Tab, save, and read the file
//   back from disk; then wait for the status bar to show the latency;
// - "rewrite-action": select cfg.selectDown lines down and to the line's end, run "Refactor...", pick "Rewrite
//   selection" in the code action menu; "rewrite-instruction": the same selection, then the command
//   "DiffusionGemma: Rewrite selection with instruction...", the instruction typed in its input box, Enter. Both wait
//   for the editor to show cfg.expected, save and read the file back, then undo once (Ctrl+Z), save, and read the
//   file back again.
// - "menu": Ctrl+Space until the suggest widget lists cfg.label, Enter, then the editor shows cfg.expected; save.
// - "partial": as "inline" until the ghost text shows, then cfg.presses (the keys of VS Code's acceptNextWord and
//   acceptNextLine) until all of cfg.middle is in, each taking a piece while the ghost text shows the rest; the
//   engine's requests are counted from its log (cfg.engineLog) after each; then Escape and save.
// - "next-edit": rename a parameter (cfg.renameAt, cfg.newName), wait for the next edit drawn (a line struck through,
//   ghost text after it), Tab, save and read back, then one undo, save and read back.
// - "next-edit-chain": rename a name (cfg.renameAt, cfg.newName), then for each of cfg.steps (the text after each Tab):
//   wait for the chain's next place drawn away from the cursor, record it with the cursor and the engine's requests so
//   far (cfg.engineLog), Tab, wait for the editor to show the step and the cursor to reach the place; then save.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';

const cfg = JSON.parse(process.env.DIFFGEMMA_E2E ?? '{}');
const t0 = Date.now();
const report = { ok: false, phase: 'setup', log: [], console: [] };
let page;

function log(message) {
  const line = `${((Date.now() - t0) / 1000).toFixed(2).padStart(6)} s  ${message}`;
  report.log.push(line);
  if (cfg.verbose) console.log(line);
}

class StepFailed extends Error {}

/** Calls check() every intervalMs until it returns a truthy value (returned) or ms pass (StepFailed). */
async function poll(phase, ms, check, intervalMs = 100) {
  report.phase = phase;
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    try {
      const value = await check();
      if (value) return value;
      last = value;
    } catch (error) {
      last = `error: ${error instanceof Error ? error.message.split('\n')[0] : error}`;
    }
    if (Date.now() > deadline) throw new StepFailed(`${phase}: gave up after ${ms} ms (last: ${JSON.stringify(last)})`);
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

async function shot(name) {
  if (!cfg.shots || !page) return;
  try {
    mkdirSync(cfg.shots, { recursive: true });
    await page.screenshot({ path: path.join(cfg.shots, `${name}.png`) });
  } catch (error) {
    log(`screenshot ${name} failed: ${error}`);
  }
}

/** The extension's status bar item: its text without codicons (e.g. "DG 42 ms"), or "" while it is absent. */
async function statusText() {
  return page.evaluate(() => {
    for (const item of document.querySelectorAll('.statusbar-item')) {
      if (item.id && item.id.startsWith('diffgemma.diffgemma')) {
        return (item.textContent ?? '').replace(/\u00a0/g, ' ').trim();
      }
    }
    return '';
  });
}

/** The ghost text in the active editor, normalised: its first line is decorations in the cursor's line, the others
 * are the lines of a preview view zone (Monaco renders spaces as U+00A0). */
async function ghostText() {
  return page.evaluate(() => {
    const editor =
      document.querySelector('.editor-instance .monaco-editor.focused') ??
      document.querySelector('.editor-instance .monaco-editor');
    if (!editor) return '';
    const decorations = '.view-lines .ghost-text-decoration, .view-lines .ghost-text-decoration-preview';
    const inline = [...editor.querySelectorAll(decorations)]
      .map((node) => node.textContent ?? '')
      .join('');
    const top = (node) => Number.parseFloat(node.style.top || '0');
    const extra = [...editor.querySelectorAll('.suggest-preview-text .view-line')]
      .sort((a, b) => top(a) - top(b))
      .map((node) => node.textContent ?? '');
    if (!inline && extra.length === 0) return '';
    return [inline, ...extra].join('\n').replace(/\u00a0/g, ' ');
  });
}

/** Where the dom has ghost text (for the report when it does not look as expected). */
async function ghostDom() {
  return page.evaluate(() =>
    [...document.querySelectorAll('[class*="ghost-text"]')].map((node) => ({
      cls: node.className,
      parents: [node.parentElement, node.parentElement?.parentElement, node.parentElement?.parentElement?.parentElement]
        .map((p) => p?.className)
        .join(' < '),
      text: node.textContent,
    })),
  );
}

/** Runs a command from the command palette: the row whose label is exactly `label`, then the palette closes. */
async function runCommand(label) {
  await pickCommand(label);
  await page.locator('.quick-input-widget').waitFor({ state: 'hidden', timeout: 10000 });
  log(`ran "${label}"`);
}

/** The active editor's text as rendered (every line of a small file is in the DOM), spaces normalised. */
async function editorText() {
  return page.evaluate(() => {
    const editor =
      document.querySelector('.editor-instance .monaco-editor.focused') ??
      document.querySelector('.editor-instance .monaco-editor');
    if (!editor) return '';
    const top = (node) => Number.parseFloat(node.style.top || '0');
    return [...editor.querySelectorAll('.view-lines .view-line')]
      .sort((a, b) => top(a) - top(b))
      .map((node) => node.textContent ?? '')
      .join('\n')
      .replace(/\u00a0/g, ' ');
  });
}

/** Polls until the active editor shows exactly `text`; returns it. */
function untilText(phase, ms, text, intervalMs = 100) {
  return poll(phase, ms, async () => ((await editorText()) === text ? text : false), intervalMs);
}

/** Opens the command palette on the command whose label is exactly `label` and picks it; returns at once. */
async function pickCommand(label) {
  await page.keyboard.press('F1');
  const input = page.locator('.quick-input-widget input');
  await input.waitFor({ state: 'visible', timeout: 10000 });
  await input.fill(`>${label}`);
  const row = page
    .locator('.quick-input-list .monaco-list-row')
    .filter({ has: page.locator('.label-name').getByText(label, { exact: true }) })
    .first();
  await row.waitFor({ state: 'visible', timeout: 10000 });
  await row.click();
  log(`picked "${label}"`);
}

const cursorText = async () =>
  ((await page.locator('.statusbar-item[id="status.editor.selection"]').textContent()) ?? '').trim();

/** Ctrl+S, then the file on disk once it holds `text` (the command palette's File: Save if Ctrl+S did not). */
async function saveAndRead(name, text) {
  await page.keyboard.press('Control+S');
  const saved = () => readFileSync(cfg.file, 'utf8') === text && text;
  try {
    return await poll(`${name}: file saved (Ctrl+S)`, 5000, saved);
  } catch {
    log('Ctrl+S did not save; using the command palette');
    await runCommand('File: Save');
    return poll(`${name}: file saved`, 15000, saved);
  }
}

/** Rewrite selection, by the code action or by the instruction command, then one undo. */
async function rewriteSteps() {
  report.phase = 'select';
  for (let i = 0; i < cfg.selectDown; i++) await page.keyboard.press('Shift+ArrowDown');
  await page.keyboard.press('Shift+End');
  report.selection = await poll('selection', 10000, async () => {
    const text = await cursorText();
    return text.includes(cfg.selectedCursor) ? text : false;
  });
  log(`selected: ${report.selection}`);
  report.before = await editorText();
  await shot('2-selected');

  if (cfg.scenario === 'rewrite-action') {
    await pickCommand('Refactor...');
    const menu = page.locator('.action-widget');
    await menu.waitFor({ state: 'visible', timeout: 20000 });
    const row = menu.locator('.monaco-list-row', { hasText: 'Rewrite selection' }).first();
    await row.waitFor({ state: 'visible', timeout: 20000 });
    report.actions = (await menu.locator('.monaco-list-row').allTextContents()).map((text) => text.trim());
    log(`code actions: ${JSON.stringify(report.actions)}`);
    await shot('3-actions');
    // The menu puts a pointer block over the page (no clicks): move the focus to the action, then Enter.
    await poll('action focused', 5000, async () => {
      const focused = (await menu.locator('.monaco-list-row.focused').textContent().catch(() => '')) ?? '';
      if (focused.includes('Rewrite selection')) return true;
      await page.keyboard.press('ArrowDown');
      return false;
    });
    await page.keyboard.press('Enter');
    log('picked "Rewrite selection"');
  } else {
    await pickCommand('DiffusionGemma: Rewrite selection with instruction...');
    const box = page.locator('.quick-input-widget');
    await poll('instruction input box', 10000, async () => {
      const title = (await box.locator('.quick-input-title').textContent().catch(() => '')) ?? '';
      return (await box.isVisible()) && title.includes('Rewrite selection') ? title : false;
    });
    await page.keyboard.type(cfg.instruction);
    report.typed = await box.locator('input').inputValue();
    await shot('3-instruction');
    await page.keyboard.press('Enter');
    log(`typed the instruction ${JSON.stringify(report.typed)}`);
  }

  report.phase = 'rewrite';
  report.rewritten = await untilText('rewritten', 60000, cfg.expected, 200);
  log('the rewrite landed');
  await shot('4-rewritten');
  report.savedAfterRewrite = await saveAndRead('rewrite', cfg.expected);

  report.phase = 'undo';
  await page.keyboard.press('Control+Z');
  report.undone = await untilText('undone', 10000, cfg.original);
  log('one undo restored the selection');
  report.savedAfterUndo = await saveAndRead('undo', cfg.original);
  await shot('5-undone');
}

/** The completion menu: Ctrl+Space until the suggest widget lists cfg.label, then Enter (VS Code's accept key);
 * wait for the editor to show cfg.expected, save and read the file back. */
async function menuSteps() {
  const widget = page.locator('.editor-widget.suggest-widget');
  const rows = async () =>
    (await widget.locator('.monaco-list-row').allTextContents()).map((text) => text.replace(/\u00a0/g, ' ').trim());
  let asks = 0;
  let askedAt = 0;
  report.menu = await poll('the item in the suggest widget', 60000, async () => {
    const listed = (await widget.isVisible()) ? await rows() : [];
    if (listed.some((row) => row.includes(cfg.label))) return listed;
    if (Date.now() - askedAt > 3000 && asks < 12) {
      // the first answers may be empty while the engine warms up: close the widget and ask again
      if (await widget.isVisible()) await page.keyboard.press('Escape');
      asks += 1;
      askedAt = Date.now();
      await page.keyboard.press('Control+Space');
    }
    return false;
  }, 200);
  report.asks = asks;
  log(`suggest widget: ${JSON.stringify(report.menu)} after ${asks} Ctrl+Space`);
  await shot('2-menu');
  report.phase = 'accept';
  await page.keyboard.press('Enter');
  report.accepted = await untilText('accepted', 10000, cfg.expected);
  log('Enter inserted the item');
  await shot('3-accepted');
  report.saved = await saveAndRead('menu', cfg.expected);
}

/** What the active editor draws for a next edit: the text of the spans struck through, and the ghost text its
 * decorations put after the lines (CSS ::after content, which is not in the DOM's text). */
async function nextEditDrawing() {
  return page.evaluate(() => {
    const editor =
      document.querySelector('.editor-instance .monaco-editor.focused') ??
      document.querySelector('.editor-instance .monaco-editor');
    if (!editor) return { struck: [], after: [] };
    const top = (node) => Number.parseFloat(node.style.top || '0');
    const lines = [...editor.querySelectorAll('.view-lines .view-line')].sort((a, b) => top(a) - top(b));
    // Per line, the text of its struck-through spans (a line's tokens are spans of their own).
    const struck = lines
      .map((line) =>
        [...line.querySelectorAll('span span')]
          .filter((node) => getComputedStyle(node).textDecorationLine.includes('line-through'))
          .map((node) => node.textContent ?? '')
          .join('')
          .replace(/\u00a0/g, ' '),
      )
      .filter((text) => text !== '');
    const after = [...editor.querySelectorAll('.view-lines .view-line span')]
      .map((node) => getComputedStyle(node, '::after').content)
      .filter((content) => content && content !== 'none' && content !== 'normal' && content !== '""')
      .map((content) => JSON.parse(content).replace(/\u00a0/g, ' '));
    return { struck, after };
  });
}

/** Rename the word at cfg.renameAt ("line:column", 1-based) to cfg.newName, typed as a user types it; waits for the
 * editor to show cfg.renamed. */
async function renameWord() {
  report.phase = 'rename';
  await page.keyboard.press('Control+P');
  const input = page.locator('.quick-input-widget input');
  await input.waitFor({ state: 'visible', timeout: 10000 });
  await input.fill(`${cfg.fileName}:${cfg.renameAt}`);
  await page.keyboard.press('Enter');
  await page.waitForTimeout(300);
  await page.keyboard.press('Control+Shift+ArrowRight');
  await page.keyboard.type(cfg.newName);
  report.renamed = await untilText('renamed', 10000, cfg.renamed);
  log(`renamed: ${JSON.stringify(report.renamed)}`);
}

/** Polls until a next edit is drawn (text struck through and ghost text after it); returns the drawing. */
function untilDrawn(phase, ms) {
  return poll(phase, ms, async () => {
    const drawing = await nextEditDrawing();
    return drawing.struck.length && drawing.after.length ? drawing : false;
  }, 200);
}

/** A next edit: rename a parameter at cfg.renameAt, wait for the suggestion drawn, Tab, save; then one undo, save. */
async function nextEditSteps() {
  await renameWord();
  report.phase = 'suggestion';
  report.drawing = await untilDrawn('next edit drawn', 30000);
  log(`drawn: ${JSON.stringify(report.drawing)}`);
  await shot('2-suggested');

  report.phase = 'apply';
  await page.keyboard.press('Tab');
  report.applied = await untilText('applied', 10000, cfg.expected);
  report.drawingAfter = await nextEditDrawing();
  log('Tab applied the suggestion');
  await shot('3-applied');
  report.savedAfterApply = await saveAndRead('apply', cfg.expected);

  report.phase = 'undo';
  await page.keyboard.press('Control+Z');
  report.undone = await untilText('undone', 10000, cfg.renamed);
  log('one undo took the suggestion back');
  report.savedAfterUndo = await saveAndRead('undo', cfg.renamed);
}

/** The engine's requests so far, as its log (cfg.engineLog) holds them: one line each. */
function engineRequests() {
  if (!existsSync(cfg.engineLog)) return [];
  return readFileSync(cfg.engineLog, 'utf8')
    .split('\n')
    .filter((line) => /request \S+.*, \d+ steps/.test(line));
}

/** A rename chain (issue 45, next edits that jump): rename, then one Tab per place of cfg.steps, each drawn away from
 * the cursor first; the cursor follows each Tab to its place (cfg.placeLines, 0-based). Then save. */
async function nextEditChainSteps() {
  await renameWord();
  report.tabs = [];
  for (const [index, expected] of cfg.steps.entries()) {
    const drawing = await untilDrawn(`place ${index + 1} drawn`, 60000);
    const rewrites = engineRequests().filter((line) => line.includes('a rewrite at strength')); // next edits
    const tab = { drawing, cursor: await cursorText(), requests: rewrites };
    log(`place ${index + 1}: ${JSON.stringify(drawing)}, cursor ${tab.cursor}`);
    await shot(`${index + 2}-place-${index + 1}`);
    report.phase = `Tab ${index + 1}`;
    await page.keyboard.press('Tab');
    tab.text = await untilText(`edit ${index + 1} applied`, 10000, expected);
    const at = `Ln ${cfg.placeLines[index] + 1}, Col 1`;
    tab.cursorAfter = await poll(`cursor at place ${index + 1}`, 5000, async () => {
      const text = await cursorText();
      return text === at || text.startsWith(`${at} `) ? text : false;
    }).catch(cursorText);
    log(`Tab ${index + 1} applied the place; cursor ${tab.cursorAfter}`);
    report.tabs.push(tab);
  }
  report.drawingAfter = await nextEditDrawing();
  report.saved = await saveAndRead('chain', cfg.steps[cfg.steps.length - 1]);
}

/** Triggers until ghost text shows (the first request may come back empty while the engine warms up), then waits
 * for all of cfg.middle to render. */
async function showGhost() {
  // Trigger until ghost text shows (the first request may come back empty while the engine warms up).
  let triggers = 0;
  report.ghost = await poll('ghost text', 60000, async () => {
    const ghost = await ghostText();
    if (ghost.trim()) return ghost;
    if (triggers === 0 || (Date.now() - report.lastTrigger > 5000 && triggers < 8)) {
      triggers += 1;
      report.lastTrigger = Date.now();
      await runCommand('Trigger Inline Suggestion');
    }
    return false;
  }, 200);
  report.triggers = triggers;
  // Let the rest of a multi-line suggestion render, then read it again.
  await poll('whole ghost text', 5000, async () => {
    report.ghost = await ghostText();
    return report.ghost === cfg.middle;
  });
  report.ghostDom = await ghostDom();
  log(`ghost text: ${JSON.stringify(report.ghost)} after ${triggers} trigger(s)`);
  await shot('2-ghost');
}

/** What of cfg.middle is in the editor, read from the cursor (the status bar's "Ln L, Col C"): the suggestion is
 * taken from cfg.line, column 1, to the cursor. (The rendered lines are no help: the ghost text's first line is drawn
 * inside the cursor's line.) */
async function takenOfMiddle() {
  const match = /Ln (\d+), Col (\d+)/.exec(await cursorText());
  if (!match) return null;
  const lines = cfg.middle.split('\n');
  const row = Number(match[1]) - cfg.line;
  if (row < 0 || row >= lines.length) return null;
  return [...lines.slice(0, row), lines[row].slice(0, Number(match[2]) - 1)].join('\n');
}

/** Partial accept: each of cfg.presses (the keys of VS Code's acceptNextWord and acceptNextLine) until all of
 * cfg.middle is in: after each, the editor holds more of it and the ghost text shows the rest (anything once all is
 * taken: a new suggestion may show); the engine's request count each time. */
async function partialSteps() {
  report.phase = 'partial accept';
  report.engineRequestsShown = engineRequests().length;
  report.steps = [];
  let before = '';
  for (const key of cfg.presses) {
    if (before === cfg.middle) break;
    await page.keyboard.press(key);
    const step = await poll(`more of the suggestion after ${key}`, 10000, async () => {
      const taken = await takenOfMiddle();
      const ghost = await ghostText();
      const rest = taken === null ? null : cfg.middle.slice(taken.length);
      report.lastSeen = { taken, ghost, cursor: await cursorText() };
      return taken !== null && taken.length > before.length && (rest === '' || ghost === rest) ? { taken, ghost } : false;
    });
    await page.waitForTimeout(500); // a request the edit set off would be in the engine's log by now
    report.steps.push({ key, ...step, piece: step.taken.slice(before.length), engineRequests: engineRequests().length });
    log(`${key} took ${JSON.stringify(step.taken.slice(before.length))}; ghost text ${JSON.stringify(step.ghost)}`);
    await shot(`3-partial-${report.steps.length}`);
    before = step.taken;
  }
  await page.keyboard.press('Escape');
  report.saved = await saveAndRead('partial', cfg.prefix + cfg.middle + cfg.suffix);
}

/** The user's steps; throws StepFailed (or Playwright's errors) when one does not happen in time. */
async function steps(browser) {
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
  page = await context.newPage();
  page.on('console', (message) => {
    if (message.type() === 'error' && report.console.length < 40) report.console.push(message.text().slice(0, 300));
  });

  report.phase = 'workbench';
  await page.goto(`${cfg.url}/?folder=${encodeURIComponent(cfg.workspace)}`, { timeout: 60000 });
  await page.locator('.monaco-workbench').waitFor({ state: 'visible', timeout: 60000 });
  log('workbench loaded');

  report.statusFirst = await poll('extension status bar item', 60000, statusText);
  log(`status bar item: "${report.statusFirst}"`);

  // Quick open "file:line" puts the cursor at the start of that line: the empty line after the prefix.
  report.phase = 'open file';
  await page.keyboard.press('Control+P');
  const input = page.locator('.quick-input-widget input');
  await input.waitFor({ state: 'visible', timeout: 10000 });
  const column = cfg.column ?? 1;
  await input.fill(`${cfg.fileName}:${cfg.line}:${column}`);
  await page
    .locator('.quick-input-list .monaco-list-row', { hasText: cfg.fileName })
    .first()
    .waitFor({ state: 'visible', timeout: 20000 });
  await page.keyboard.press('Enter');
  await poll('editor focused', 20000, () =>
    page.evaluate(
      (name) =>
        document.querySelector('.tab.active')?.textContent?.includes(name) &&
        document.querySelector('.editor-instance .monaco-editor.focused') !== null,
      cfg.fileName,
    ),
  );
  report.cursor = await poll('cursor position', 10000, async () => {
    const text = await page.locator('.statusbar-item[id="status.editor.selection"]').textContent();
    return text && text.includes(`Ln ${cfg.line}, Col ${column}`) ? text.trim() : false;
  });
  log(`opened ${cfg.fileName}; cursor: ${report.cursor}`);

  report.statusReady = await poll('engine ready', cfg.readyTimeoutMs, async () => {
    const text = await statusText();
    return /DG (ready|\d+ ms)/.test(text) ? text : false;
  }, 250);
  log(`engine ready: status bar "${report.statusReady}"`);
  await shot('1-ready');
  if (cfg.scenario === 'next-edit') {
    await nextEditSteps();
    return;
  }
  if (cfg.scenario === 'next-edit-chain') {
    await nextEditChainSteps();
    return;
  }
  if (cfg.scenario === 'menu') {
    await menuSteps();
    return;
  }
  if (cfg.scenario?.startsWith('rewrite')) {
    await rewriteSteps();
    return;
  }

  await showGhost();
  if (cfg.scenario === 'partial') {
    await partialSteps();
    return;
  }

  // Tab, as a user does. When the suggestion starts with at least a tab's worth of indentation, VS Code's first
  // Tab indents the line (the ghost text stays, less that indentation) and the next Tab accepts.
  report.phase = 'accept';
  report.tabPresses = 0;
  report.cursorAfterAccept = await poll('ghost text accepted', 15000, async () => {
    const text = await cursorText();
    if (text && text.includes(cfg.acceptedCursor)) return text.trim();
    // A second Tab only while the ghost text is what is left of the suggestion (never a newer suggestion).
    const rest = report.tabPresses === 1 ? await ghostText() : '';
    if (report.tabPresses === 0 || (report.tabPresses === 1 && rest && cfg.middle.endsWith(rest))) {
      report.tabPresses += 1;
      await page.keyboard.press('Tab');
      log(`Tab (${report.tabPresses}); cursor was at ${text?.trim()}`);
      await page.waitForTimeout(300);
    }
    return false;
  });
  log('Tab accepted the suggestion');
  await shot('3-accepted');

  // VS Code asks again after every edit, the accept included: note whether a new suggestion shows (not asserted).
  report.ghostAfterAccept = await poll('ghost text after accept', 3000, ghostText).catch(() => '');
  log(`ghost text after accept: ${JSON.stringify(report.ghostAfterAccept)}`);

  report.phase = 'save';
  await page.keyboard.press('Escape'); // dismiss any new ghost text: saving must not accept anything
  const savedText = () => {
    const text = readFileSync(cfg.file, 'utf8');
    return text !== cfg.original ? text : false;
  };
  await page.keyboard.press('Control+S');
  try {
    report.saved = await poll('file saved (Ctrl+S)', 5000, savedText);
  } catch {
    log('Ctrl+S did not save; using the command palette');
    await runCommand('File: Save');
    report.saved = await poll('file saved', 15000, savedText);
  }
  log(`saved: ${JSON.stringify(report.saved)}`);

  report.statusAfter = await poll('status bar latency', 15000, async () => {
    const text = await statusText();
    return /DG \d+ ms/.test(text) ? text : false;
  });
  log(`status bar: "${report.statusAfter}"`);
  await shot('4-done');
}

async function main() {
  const browser = await chromium.launch({
    executablePath: cfg.chromium,
    headless: true,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-dev-shm-usage',
      '--disable-background-networking',
      '--disable-extensions',
      '--no-first-run',
    ],
  });
  // A last resort: a report before the test's own timeout, even if a step hangs.
  let timer;
  const watchdog = new Promise((_, reject) => {
    const ms = cfg.timeoutMs ?? 300000;
    timer = setTimeout(() => reject(new StepFailed(`timed out after ${ms} ms in phase "${report.phase}"`)), ms);
  });
  try {
    await Promise.race([steps(browser), watchdog]);
    report.ok = true;
    report.phase = 'done';
  } catch (error) {
    report.why = error instanceof StepFailed ? error.message : String(error?.stack ?? error);
    log(`FAIL (${report.phase}): ${report.why}`);
    try {
      report.statusAtFailure = await statusText();
      report.textAtFailure = await editorText();
      report.ghostDomAtFailure = await ghostDom();
      report.statusBarAtFailure = await page.evaluate(() =>
        [...document.querySelectorAll('.statusbar-item')].map((node) => `${node.id}: ${node.textContent}`),
      );
      report.notifications = await page.evaluate(() =>
        [...document.querySelectorAll('.notification-list-item-message')].map((node) => node.textContent),
      );
    } catch {
      // the page may be gone
    }
    await shot('failure');
  } finally {
    clearTimeout(timer);
    await browser.close().catch(() => {});
  }
}

try {
  if (!cfg.report || !existsSync(cfg.file)) {
    throw new Error('DIFFGEMMA_E2E must name a report path and an existing file');
  }
  await main();
} catch (error) {
  report.why = String(error?.stack ?? error);
} finally {
  report.seconds = (Date.now() - t0) / 1000;
  if (cfg.report) writeFileSync(cfg.report, JSON.stringify(report, null, 2));
}
process.exit(report.ok ? 0 : 1);
