/**
 * Next edits in the editor: once the user pauses after an edit, ask the server (`diffgemma/nextEdit`) for the edit
 * that follows, and draw it near the cursor: the text it removes struck through, the text it adds as ghost text after
 * it. Tab applies the whole suggestion in one undo step, Escape dismisses it, and so does any change to the document
 * or a switch of editor. A suggestion away from the cursor (`jump`: a chain's next place) is scrolled into view and
 * hinted at the cursor ("Tab: line N"); Tab applies it and takes the cursor there, and the next place is asked for. A suggestion that is only an insertion at the cursor is offered as an ordinary inline
 * completion instead (VS Code draws and accepts that itself).
 */
import * as vscode from 'vscode';
import { type LanguageClient, State } from 'vscode-languageclient/node';
import {
  asSuggestion,
  drawing,
  insertionAtCursor,
  type LspTextEdit,
  NEXT_EDIT_METHOD,
  type NextEditSuggestion,
  nextEditParams,
} from './nextEdit';
import type { LspRange } from './rewrite';

export const NEXT_EDIT_COMMANDS = {
  accept: 'diffgemma.acceptNextEdit',
  dismiss: 'diffgemma.dismissNextEdit',
} as const;
/** The context key the Tab and Escape keybindings need (package.json). */
export const VISIBLE_CONTEXT = 'diffgemma.nextEditVisible';
/** How long typing pauses before the server is asked (its answer needs the engine, so not on every keystroke). */
export const ASK_DELAY_MS = 500;

function asRange(range: LspRange): vscode.Range {
  return new vscode.Range(range.start.line, range.start.character, range.end.line, range.end.character);
}

interface Shown {
  editor: vscode.TextEditor;
  suggestion: NextEditSuggestion;
  /** The whole suggestion when it is an insertion at the cursor (offered as an inline completion). */
  inline?: string;
}

export class NextEditView implements vscode.Disposable {
  private readonly removed = vscode.window.createTextEditorDecorationType({
    textDecoration: 'line-through',
    backgroundColor: new vscode.ThemeColor('diffEditor.removedTextBackground'),
  });
  private readonly added = vscode.window.createTextEditorDecorationType({});
  private readonly hint = vscode.window.createTextEditorDecorationType({});
  private shown: Shown | undefined;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private pending: vscode.CancellationTokenSource | undefined;
  /** The document version an inline completion was last shown for: no next edit is asked over it. */
  private completionShown: { uri: string; version: number } | undefined;

  constructor(
    private readonly client: () => LanguageClient | undefined,
    private readonly enabled: () => boolean,
    private readonly output: vscode.LogOutputChannel,
  ) {}

  /** A document changed: what is shown for it goes, and for the active editor's document the server is asked again
   * once typing pauses. */
  onDidChange(event: vscode.TextDocumentChangeEvent): void {
    if (!event.contentChanges.length) {
      return;
    }
    if (this.shown?.editor.document === event.document) {
      this.dismiss();
    }
    const editor = vscode.window.activeTextEditor;
    const scheme = event.document.uri.scheme;
    if (editor?.document === event.document && (scheme === 'file' || scheme === 'untitled') && this.enabled()) {
      this.schedule(editor); // the documents the server is sent (clientOptions' documentSelector)
    }
  }

  /** The server showed an inline completion at this version: a next edit would cover it. */
  completionOffered(document: vscode.TextDocument): void {
    this.completionShown = { uri: document.uri.toString(), version: document.version };
  }

  private schedule(editor: vscode.TextEditor): void {
    this.cancel();
    this.timer = setTimeout(() => {
      this.timer = undefined;
      void this.ask(editor);
    }, ASK_DELAY_MS);
  }

  private cancel(): void {
    if (this.timer !== undefined) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
    this.pending?.cancel();
    this.pending = undefined;
  }

  /** Ask the server for the next edit at the editor's cursor, and show it if the document is still as asked. */
  async ask(editor: vscode.TextEditor): Promise<NextEditSuggestion | undefined> {
    const client = this.client();
    const { document } = editor;
    const version = document.version;
    const shown = this.completionShown;
    if (!client || client.state !== State.Running || (shown?.uri === document.uri.toString() && shown.version === version)) {
      return undefined;
    }
    const uri = client.code2ProtocolConverter.asUri(document.uri);
    const source = new vscode.CancellationTokenSource();
    this.pending?.cancel();
    this.pending = source;
    try {
      const answer = await client.sendRequest(
        NEXT_EDIT_METHOD,
        nextEditParams(uri, version, editor.selection.active),
        source.token,
      );
      if (this.pending !== source || document.version !== version || vscode.window.activeTextEditor !== editor) {
        return undefined; // typed since, or elsewhere now: the answer is for a text that is gone
      }
      const suggestion = asSuggestion(answer, uri, version);
      if (suggestion) {
        this.show(editor, suggestion);
      }
      return suggestion;
    } catch (error) {
      this.output.debug(`next edit: ${error instanceof Error ? error.message : String(error)}`);
      return undefined;
    } finally {
      if (this.pending === source) {
        this.pending = undefined;
      }
      source.dispose();
    }
  }

  /** Draw `suggestion` in `editor`, or offer it as an inline completion when it only inserts at the cursor. */
  show(editor: vscode.TextEditor, suggestion: NextEditSuggestion): void {
    this.dismiss();
    const inline = insertionAtCursor(suggestion, editor.selection.active);
    this.shown = { editor, suggestion, inline };
    if (inline !== undefined) {
      void vscode.commands.executeCommand('editor.action.inlineSuggest.trigger');
      return;
    }
    const plan = drawing(suggestion.edits, (line) => editor.document.lineAt(line).text);
    editor.setDecorations(this.removed, plan.deletions.map(asRange));
    editor.setDecorations(
      this.added,
      plan.insertions.map(({ at, text }) => ({
        range: new vscode.Range(at.line, at.character, at.line, at.character),
        renderOptions: {
          after: {
            contentText: `  ${text.trimStart()}`,
            color: new vscode.ThemeColor('editorGhostText.foreground'),
            fontStyle: 'italic',
          },
        },
      })),
    );
    if (suggestion.jump) {
      const target = asRange(suggestion.edits[0].range);
      const cursor = editor.selection.active;
      editor.revealRange(target, vscode.TextEditorRevealType.InCenterIfOutsideViewport);
      const after = { contentText: `  Tab: line ${target.start.line + 1}`, color: new vscode.ThemeColor('editorGhostText.foreground') };
      editor.setDecorations(this.hint, [{ range: new vscode.Range(cursor, cursor), renderOptions: { after } }]);
    }
    void vscode.commands.executeCommand('setContext', VISIBLE_CONTEXT, true);
  }

  /** The suggestion, if any, as the inline completion at `position` of `document` (the middleware adds it). */
  inlineAt(document: vscode.TextDocument, position: vscode.Position): vscode.InlineCompletionItem | undefined {
    const shown = this.shown;
    if (shown?.inline === undefined || shown.editor.document !== document || document.version !== shown.suggestion.version) {
      return undefined;
    }
    const { start } = shown.suggestion.edits[0].range;
    if (start.line !== position.line || start.character !== position.character) {
      return undefined;
    }
    return new vscode.InlineCompletionItem(shown.inline, new vscode.Range(position, position));
  }

  /** Tab: apply the whole suggestion as one edit (one undo step). False when there is none or the text moved on. */
  async accept(): Promise<boolean> {
    const shown = this.shown;
    if (!shown) {
      return false;
    }
    this.dismiss();
    const { editor, suggestion } = shown;
    if (editor.document.version !== suggestion.version) {
      return false;
    }
    const edits: LspTextEdit[] = suggestion.edits;
    const applied = await editor.edit(
      (builder) => {
        for (const edit of edits) {
          builder.replace(asRange(edit.range), edit.newText);
        }
      },
      { undoStopBefore: true, undoStopAfter: true },
    );
    if (applied && suggestion.jump) {
      const at = new vscode.Position(edits[0].range.start.line, 0); // the cursor follows to the place edited
      editor.selection = new vscode.Selection(at, at);
    }
    return applied;
  }

  /** Escape, a change, another editor: nothing shown any more. */
  dismiss(): void {
    const shown = this.shown;
    this.shown = undefined;
    if (shown) {
      shown.editor.setDecorations(this.removed, []);
      shown.editor.setDecorations(this.added, []);
      shown.editor.setDecorations(this.hint, []);
      void vscode.commands.executeCommand('setContext', VISIBLE_CONTEXT, false);
    }
  }

  /** The suggestion on screen, if any (for tests and the status). */
  current(): NextEditSuggestion | undefined {
    return this.shown?.suggestion;
  }

  dispose(): void {
    this.cancel();
    this.dismiss();
    this.removed.dispose();
    this.added.dispose();
    this.hint.dispose();
  }
}
