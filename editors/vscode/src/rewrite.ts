/** "Rewrite selection": the argument of the server's `diffgemma.rewriteSelection`. Pure, no `vscode` import. */

/** The server's command (diffgemma_lsp): its code action "Rewrite selection" runs it too. */
export const SERVER_REWRITE_COMMAND = 'diffgemma.rewriteSelection';

/** An LSP position: zero-based line, UTF-16 code units into it (what VS Code's `Position` counts too). */
export interface LspPosition {
  line: number;
  character: number;
}

export interface LspRange {
  start: LspPosition;
  end: LspPosition;
}

/** `diffgemma.rewriteSelection`'s one argument object. */
export interface RewriteArgument {
  uri: string;
  range: LspRange;
  /** The document version the selection was read at: the server applies nothing to a newer one. */
  version: number;
  /** What to do with the selection, for instruction checkpoints; absent: the model re-fills it. */
  instruction?: string;
}

/** What the command answers. */
export interface RewriteResult {
  applied: boolean;
  reason: string;
}

/** The argument for rewriting `range` (ordered: start before end) of the document `uri` at `version`; undefined for
 * an empty range, which has nothing to rewrite. A blank instruction is left out. */
export function rewriteArgument(
  uri: string,
  version: number,
  range: LspRange,
  instruction?: string,
): RewriteArgument | undefined {
  const { start, end } = range;
  if (start.line === end.line && start.character === end.character) {
    return undefined;
  }
  const argument: RewriteArgument = {
    uri,
    range: {
      start: { line: start.line, character: start.character },
      end: { line: end.line, character: end.character },
    },
    version,
  };
  const text = instruction?.trim() ?? '';
  if (text !== '') {
    argument.instruction = text;
  }
  return argument;
}

/** The command's answer, or undefined when it is not one (an older server, a null result). */
export function asRewriteResult(value: unknown): RewriteResult | undefined {
  if (typeof value !== 'object' || value === null) {
    return undefined;
  }
  const { applied, reason } = value as Record<string, unknown>;
  if (typeof applied !== 'boolean') {
    return undefined;
  }
  return { applied, reason: typeof reason === 'string' ? reason : '' };
}
