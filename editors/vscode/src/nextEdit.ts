/**
 * Next edits: the server's `diffgemma/nextEdit` request and answer, and how a suggestion is drawn. Pure, no `vscode`
 * import (src/nextEditView.ts draws it).
 */
import type { LspPosition, LspRange } from './rewrite';

/** The server's request (diffgemma_lsp/features/next_edit.py). */
export const NEXT_EDIT_METHOD = 'diffgemma/nextEdit';

export interface LspTextEdit {
  range: LspRange;
  newText: string;
}

/** The request's params: the document at the version the editor holds, and the cursor. */
export interface NextEditParams {
  textDocument: { uri: string; version: number };
  position: LspPosition;
}

/** A suggestion: whole-line edits inside the window around the cursor, for one version of the document; with
 * `jump`, edits away from the cursor (the next place of a chain, such as another use of a renamed name): Tab takes
 * the user there as it applies them. */
export interface NextEditSuggestion {
  uri: string;
  version: number;
  edits: LspTextEdit[];
  jump?: boolean;
}

export function nextEditParams(uri: string, version: number, position: LspPosition): NextEditParams {
  return { textDocument: { uri, version }, position: { line: position.line, character: position.character } };
}

function isPosition(value: unknown): value is LspPosition {
  const { line, character } = (value ?? {}) as Record<string, unknown>;
  return Number.isInteger(line) && Number.isInteger(character) && (line as number) >= 0 && (character as number) >= 0;
}

function before(a: LspPosition, b: LspPosition): boolean {
  return a.line < b.line || (a.line === b.line && a.character < b.character);
}

/**
 * The server's answer as a suggestion for `uri` at `version`; undefined for `null` (no suggestion), for an answer
 * about another document or version (the user has typed since), and for anything that is not a well-formed answer:
 * edits with ordered ranges that do not overlap, at least one of them.
 */
export function asSuggestion(value: unknown, uri: string, version: number): NextEditSuggestion | undefined {
  if (typeof value !== 'object' || value === null) {
    return undefined;
  }
  const answer = value as Record<string, unknown>;
  if (answer.uri !== uri || answer.version !== version || !Array.isArray(answer.edits) || !answer.edits.length) {
    return undefined;
  }
  const edits: LspTextEdit[] = [];
  for (const item of answer.edits as unknown[]) {
    const { range, newText } = (item ?? {}) as Record<string, unknown>;
    const { start, end } = (range ?? {}) as Record<string, unknown>;
    if (!isPosition(start) || !isPosition(end) || before(end, start) || typeof newText !== 'string') {
      return undefined;
    }
    const previous = edits[edits.length - 1];
    if (previous && before(start, previous.range.end)) {
      return undefined;
    }
    edits.push({ range: { start: { ...start }, end: { ...end } }, newText });
  }
  return answer.jump === true ? { uri, version, edits, jump: true } : { uri, version, edits };
}

/** Where a suggestion's new text shows as ghost text: after `at`, one line of it per line of the document. */
export interface Insertion {
  at: LspPosition;
  text: string;
}

/** What the editor draws for a suggestion: the text it removes struck through, the text it adds as ghost text. */
export interface Drawing {
  deletions: LspRange[];
  insertions: Insertion[];
}

const NEWLINE = /\r\n|\r|\n/;

/** The lines `newText` puts in place of `range`: for whole lines (a range from a line's start to a line's start),
 * the lines it holds, none for ""; otherwise its text split at line breaks. */
function newLines({ range, newText }: LspTextEdit): string[] {
  const wholeLines = range.start.character === 0 && range.end.character === 0;
  if (wholeLines) {
    return newText === '' ? [] : newText.replace(/(\r\n|\r|\n)$/, '').split(NEWLINE);
  }
  return newText.split(NEWLINE);
}

/**
 * How to draw `edits` on a document whose lines are `lineAt(n)`: the text each removes struck through; each line it
 * replaces followed by its new line as ghost text, new lines past the replaced ones after the last of them, joined by
 * "⏎" (a decoration is one line); lines only inserted shown at the end of the line before them.
 */
export function drawing(edits: LspTextEdit[], lineAt: (line: number) => string): Drawing {
  const deletions: LspRange[] = [];
  const insertions: Insertion[] = [];
  for (const edit of edits) {
    const { start, end } = edit.range;
    const added = newLines(edit);
    const lastLine = end.character === 0 && end.line > start.line ? end.line - 1 : end.line;
    const removed: number[] = [];
    for (let line = start.line; line <= lastLine && before(start, end); line++) {
      const from = line === start.line ? start.character : 0;
      const to = line === end.line ? end.character : lineAt(line).length;
      deletions.push({ start: { line, character: from }, end: { line, character: to } });
      removed.push(line);
    }
    if (!removed.length) {
      const text = added.join(' ⏎ ');
      if (text === '') {
        continue;
      }
      if (start.character === 0 && start.line > 0) {
        insertions.push({ at: { line: start.line - 1, character: lineAt(start.line - 1).length }, text: `⏎ ${text}` });
      } else {
        insertions.push({ at: { ...start }, text });
      }
      continue;
    }
    removed.forEach((line, index) => {
      const last = index === removed.length - 1;
      const text = last ? added.slice(index).join(' ⏎ ') : (added[index] ?? '');
      if (text !== '') {
        insertions.push({ at: { line, character: lineAt(line).length }, text });
      }
    });
  }
  return { deletions, insertions };
}

/**
 * The text to insert at `cursor` when the whole suggestion is that (one edit, an empty range at the cursor): VS Code
 * shows it as an ordinary inline completion. Undefined otherwise.
 */
export function insertionAtCursor(suggestion: NextEditSuggestion, cursor: LspPosition): string | undefined {
  if (suggestion.edits.length !== 1) {
    return undefined;
  }
  const [{ range, newText }] = suggestion.edits;
  const empty = range.start.line === range.end.line && range.start.character === range.end.character;
  const at = range.start.line === cursor.line && range.start.character === cursor.character;
  return empty && at && newText !== '' ? newText : undefined;
}
