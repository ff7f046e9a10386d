/** The status bar item's text, from the server's `diffgemma.status` answer. Pure functions, no `vscode` import. */

/** What `workspace/executeCommand` `diffgemma.status` returns (see diffgemma_lsp/server.py). */
export interface ServerStatus {
  /** "engine" (the local engine) or "openai" (a remote OpenAI-compatible server). */
  backend?: string;
  engine: string;
  model?: string;
  pending?: number;
  inflight?: number;
  lastLatencyMs?: number | null;
  lastTimings?: EngineTimings | null;
}

/** The engine's own timings of the last completion (snake_case, as the server sends them). */
export interface EngineTimings {
  queue_ms?: number;
  encode_ms?: number;
  denoise_ms?: number;
  steps?: number;
  new_tokens?: number;
  cached_tokens?: number;
}

export type ClientPhase = 'starting' | 'running' | 'stopped' | 'failed';

export interface StatusInput {
  phase: ClientPhase;
  enabled: boolean;
  status?: ServerStatus;
  /** Why the server did not start (phase "failed"). */
  error?: string;
}

export interface StatusView {
  text: string;
  tooltip: string;
  severity: 'ok' | 'busy' | 'warning' | 'error';
}

const CLICK = 'Click for status, log and restart.';

function latencyLine(status: ServerStatus): string | undefined {
  if (status.lastLatencyMs === undefined || status.lastLatencyMs === null) {
    return undefined;
  }
  let line = `Last completion: ${Math.round(status.lastLatencyMs)} ms`;
  const t = status.lastTimings;
  if (t) {
    const ms = (value: number | undefined) => Math.round(value ?? 0);
    line +=
      ` (queue ${ms(t.queue_ms)}, encode ${ms(t.encode_ms)}, denoise ${ms(t.denoise_ms)} ms;` +
      ` ${t.steps ?? 0} steps, ${t.new_tokens ?? 0} tokens)`;
  }
  return line;
}

/** Status bar text (with a codicon), tooltip and severity. */
export function describeStatus(input: StatusInput): StatusView {
  if (input.phase === 'failed') {
    return {
      text: '$(error) DG',
      tooltip: `DiffusionGemma: the language server did not start: ${input.error ?? 'unknown error'}\n${CLICK}`,
      severity: 'error',
    };
  }
  if (input.phase === 'stopped') {
    return {
      text: '$(circle-slash) DG off',
      tooltip: `DiffusionGemma: the language server is stopped.\n${CLICK}`,
      severity: 'warning',
    };
  }
  if (!input.enabled) {
    return {
      text: '$(circle-slash) DG off',
      tooltip: `DiffusionGemma: completions are off (setting diffgemma.enable).\n${CLICK}`,
      severity: 'ok',
    };
  }
  const status = input.status;
  if (input.phase === 'starting' || status === undefined) {
    return {
      text: '$(sync~spin) DG',
      tooltip: `DiffusionGemma: starting the language server.\n${CLICK}`,
      severity: 'busy',
    };
  }
  const lines = [`DiffusionGemma: engine ${status.engine}`];
  if (status.backend && status.backend !== 'engine') {
    lines.push(`Backend: ${status.backend}`);
  }
  if (status.model) {
    lines.push(`Model: ${status.model}`);
  }
  const latency = latencyLine(status);
  if (latency) {
    lines.push(latency);
  }
  lines.push(CLICK);
  const tooltip = lines.join('\n');
  switch (status.engine) {
    case 'ready':
      return {
        text: latency ? `$(sparkle) DG ${Math.round(status.lastLatencyMs as number)} ms` : '$(sparkle) DG ready',
        tooltip,
        severity: 'ok',
      };
    case 'loading':
      return { text: '$(sync~spin) DG loading', tooltip, severity: 'busy' };
    case 'connecting':
    case 'not started':
      return { text: '$(sync~spin) DG starting', tooltip, severity: 'busy' };
    default: // "disconnected", "failed"
      return { text: `$(warning) DG ${status.engine}`, tooltip, severity: 'warning' };
  }
}

/** How soon to ask for the status again by itself: soon while the engine starts or reconnects, less often while it
 * fails, never while it is ready (then each completion refreshes the status). */
export function pollDelayMs(status: ServerStatus | undefined): number | undefined {
  if (status === undefined || ['not started', 'connecting', 'loading', 'disconnected'].includes(status.engine)) {
    return 2000;
  }
  return status.engine === 'ready' ? undefined : 5000;
}
