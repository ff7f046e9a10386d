// Unit tests for the compiled extension (out/), with `vscode` and `vscode-languageclient/node` replaced by mocks
// through a Module._load hook. Run: npm run compile && npm test
'use strict';

const assert = require('node:assert/strict');
const Module = require('node:module');
const path = require('node:path');
const { afterEach, beforeEach, describe, test } = require('node:test');

const ROOT = path.join(__dirname, '..');
const PACKAGE_JSON = require(path.join(ROOT, 'package.json'));

// -- mocks --------------------------------------------------------------------------------------------------------

/** Everything the mocks saw, reset before each test. */
let seen;
/** User settings under "diffgemma" (on top of package.json's defaults). */
let userSettings;
/** What the mocked server answers to diffgemma.status. */
let serverStatus;
/** What the mocked server answers to diffgemma.rewriteSelection (a function of the params, or a value). */
let rewriteAnswer;
/** What the mocked input box returns (undefined: the user pressed Escape). */
let inputBoxAnswer;
/** What the mocked server answers to diffgemma/nextEdit (a function of the params, or a value). */
let nextEditAnswer;

function defaults() {
  const values = {};
  for (const [name, schema] of Object.entries(PACKAGE_JSON.contributes.configuration.properties)) {
    values[name.slice('diffgemma.'.length)] = schema.default;
  }
  return values;
}

class Disposable {
  constructor(fn) {
    this.fn = fn;
  }
  dispose() {
    this.fn?.();
  }
}

class ThemeColor {
  constructor(id) {
    this.id = id;
  }
}

class Position {
  constructor(line, character) {
    Object.assign(this, { line, character });
  }
}

class Range {
  constructor(startLine, startCharacter, endLine, endCharacter) {
    if (startLine instanceof Position) {
      this.start = startLine;
      this.end = startCharacter;
    } else {
      this.start = new Position(startLine, startCharacter);
      this.end = new Position(endLine, endCharacter);
    }
  }
}

class Selection extends Range {
  constructor(anchor, active) {
    super(anchor, active);
    Object.assign(this, { anchor, active });
  }
}

class InlineCompletionItem {
  constructor(insertText, range) {
    Object.assign(this, { insertText, range });
  }
}

class CancellationTokenSource {
  constructor() {
    this.token = { isCancellationRequested: false };
  }
  cancel() {
    this.token.isCancellationRequested = true;
  }
  dispose() {}
}

/** A document and its editor: `edit` applies the replacements to the text, as one edit, and bumps the version. */
function fakeEditor(text, cursor, uri = 'file:///work/area.py') {
  const document = {
    uri: { toString: () => uri, scheme: uri.split(':')[0] },
    version: 1,
    text,
    lineAt(line) {
      return { text: document.text.split('\n')[line] };
    },
  };
  const editor = {
    document,
    selection: { active: new Position(cursor.line, cursor.character) },
    decorations: new Map(),
    edits: [],
    revealed: [],
    setDecorations(type, ranges) {
      editor.decorations.set(type, ranges);
    },
    revealRange(range, how) {
      editor.revealed.push({ range, how });
    },
    async edit(callback, options) {
      const replacements = [];
      callback({ replace: (range, newText) => replacements.push({ range, newText }) });
      editor.edits.push({ replacements, options });
      const offset = ({ line, character }) =>
        document.text.split('\n').slice(0, line).reduce((sum, each) => sum + each.length + 1, 0) + character;
      for (const { range, newText } of [...replacements].reverse()) {
        document.text = document.text.slice(0, offset(range.start)) + newText + document.text.slice(offset(range.end));
      }
      document.version += 1;
      return true;
    },
  };
  return editor;
}

const vscodeMock = {
  StatusBarAlignment: { Left: 1, Right: 2 },
  Position,
  Range,
  Selection,
  TextEditorRevealType: { InCenterIfOutsideViewport: 2 },
  InlineCompletionItem,
  CancellationTokenSource,
  QuickPickItemKind: { Separator: -1, Default: 0 },
  ThemeColor,
  Disposable,
  window: {
    createOutputChannel(name, options) {
      const channel = { name, options, lines: [], shown: false, disposed: false };
      for (const level of ['trace', 'debug', 'info', 'warn', 'error', 'appendLine', 'append']) {
        channel[level] = (message) => channel.lines.push(`${level}: ${message}`);
      }
      channel.show = () => (channel.shown = true);
      channel.dispose = () => (channel.disposed = true);
      seen.outputChannels.push(channel);
      return channel;
    },
    createStatusBarItem(id, alignment, priority) {
      const item = { id, alignment, priority, text: '', visible: false, disposed: false };
      item.show = () => (item.visible = true);
      item.hide = () => (item.visible = false);
      item.dispose = () => (item.disposed = true);
      seen.statusItems.push(item);
      return item;
    },
    showErrorMessage: async (...args) => {
      seen.errors.push(args);
      return undefined;
    },
    showQuickPick: async (items, options) => {
      seen.quickPicks.push({ items, options });
      return undefined;
    },
    showInformationMessage: async (...args) => {
      seen.infos.push(args);
      return undefined;
    },
    showWarningMessage: async (...args) => {
      seen.warnings.push(args);
      return undefined;
    },
    showInputBox: async (options) => {
      seen.inputBoxes.push(options);
      return typeof inputBoxAnswer === 'function' ? inputBoxAnswer() : inputBoxAnswer;
    },
    activeTextEditor: undefined,
    createTextEditorDecorationType(options) {
      const type = { options, disposed: false, dispose: () => (type.disposed = true) };
      seen.decorationTypes.push(type);
      return type;
    },
    onDidChangeActiveTextEditor(listener) {
      seen.editorListeners.push(listener);
      return new Disposable(() => {});
    },
  },
  commands: {
    registerCommand(id, fn) {
      seen.commands.set(id, fn);
      return new Disposable(() => seen.commands.delete(id));
    },
    executeCommand: async (...args) => {
      seen.executed.push(args);
    },
  },
  workspace: {
    workspaceFolders: undefined,
    getConfiguration(section) {
      assert.equal(section, 'diffgemma');
      const values = { ...defaults(), ...userSettings };
      return { get: (key, fallback) => (key in values ? values[key] : fallback) };
    },
    onDidChangeConfiguration(listener) {
      seen.configListeners.push(listener);
      return new Disposable(() => {});
    },
    onDidChangeTextDocument(listener) {
      seen.changeListeners.push(listener);
      return new Disposable(() => {});
    },
  },
};

const State = { Stopped: 1, Starting: 3, Running: 2 };

class LanguageClient {
  constructor(id, name, serverOptions, clientOptions) {
    Object.assign(this, { id, name, serverOptions, clientOptions });
    this.state = State.Stopped;
    this.stateListeners = [];
    this.requests = [];
    this.notifications = [];
    this.stopped = false;
    // The real converter writes a vscode.Uri as uri.toString(); the mock's documents carry that string.
    this.code2ProtocolConverter = { asUri: (uri) => uri.toString() };
    seen.clients.push(this);
  }
  onDidChangeState(listener) {
    this.stateListeners.push(listener);
    return new Disposable(() => {});
  }
  setState(newState) {
    const oldState = this.state;
    this.state = newState;
    for (const listener of this.stateListeners) listener({ oldState, newState });
  }
  async start() {
    if (seen.failStart) throw new Error(seen.failStart);
    this.setState(State.Starting);
    this.setState(State.Running);
  }
  async stop(timeout) {
    this.stopped = true;
    this.stopTimeout = timeout;
    this.setState(State.Stopped);
  }
  async sendRequest(type, params) {
    if (type === 'diffgemma/nextEdit') {
      this.requests.push({ method: type, params });
      return typeof nextEditAnswer === 'function' ? nextEditAnswer(params) : nextEditAnswer;
    }
    this.requests.push({ method: type.method, params });
    if (type.method === 'workspace/executeCommand' && params.command === 'diffgemma.status') return serverStatus;
    if (type.method === 'workspace/executeCommand' && params.command === 'diffgemma.rewriteSelection') {
      if (rewriteAnswer instanceof Error) throw rewriteAnswer;
      return typeof rewriteAnswer === 'function' ? rewriteAnswer(params) : rewriteAnswer;
    }
    throw new Error(`unexpected request ${type.method}`);
  }
  async sendNotification(type, params) {
    this.notifications.push({ method: type.method, params });
  }
}

const languageClientMock = {
  LanguageClient,
  State,
  TransportKind: { stdio: 0, ipc: 1, pipe: 2, socket: 3 },
  RevealOutputChannelOn: { Debug: 0, Info: 1, Warn: 2, Error: 3, Never: 4 },
  ExecuteCommandRequest: { type: { method: 'workspace/executeCommand' } },
  DidChangeConfigurationNotification: { type: { method: 'workspace/didChangeConfiguration' } },
};

const originalLoad = Module._load;
Module._load = function load(request, parent, isMain) {
  if (request === 'vscode') return vscodeMock;
  if (request === 'vscode-languageclient/node') return languageClientMock;
  return originalLoad.call(this, request, parent, isMain);
};

if (!require('node:fs').existsSync(path.join(ROOT, 'out', 'extension.js'))) {
  throw new Error('out/extension.js is missing: run `npm run compile` first');
}
const extension = require(path.join(ROOT, 'out', 'extension.js'));
const { describeStatus, pollDelayMs } = require(path.join(ROOT, 'out', 'status.js'));
const { serverCommand, serverSettingKeys } = require(path.join(ROOT, 'out', 'config.js'));
const { asRewriteResult, rewriteArgument } = require(path.join(ROOT, 'out', 'rewrite.js'));
const { asSuggestion, drawing, insertionAtCursor } = require(path.join(ROOT, 'out', 'nextEdit.js'));
const { ASK_DELAY_MS, VISIBLE_CONTEXT } = require(path.join(ROOT, 'out', 'nextEditView.js'));

// -- helpers ------------------------------------------------------------------------------------------------------

function fakeContext() {
  return { subscriptions: [], extension: { packageJSON: PACKAGE_JSON } };
}

async function activate() {
  const context = fakeContext();
  const controller = await extension.activate(context);
  return { context, controller, client: seen.clients.at(-1), item: seen.statusItems.at(-1) };
}

const tick = () => new Promise((resolve) => setTimeout(resolve, 0));

beforeEach(() => {
  seen = {
    outputChannels: [],
    statusItems: [],
    clients: [],
    commands: new Map(),
    configListeners: [],
    executed: [],
    errors: [],
    quickPicks: [],
    infos: [],
    warnings: [],
    inputBoxes: [],
    decorationTypes: [],
    editorListeners: [],
    changeListeners: [],
    failStart: undefined,
  };
  nextEditAnswer = null;
  userSettings = {};
  rewriteAnswer = { applied: true, reason: '' };
  inputBoxAnswer = undefined;
  vscodeMock.window.activeTextEditor = undefined;
  serverStatus = { engine: 'ready', model: 'memorized-test', pending: 0, inflight: 0, lastLatencyMs: null };
  vscodeMock.workspace.workspaceFolders = undefined;
});

afterEach(async () => {
  await extension.deactivate();
});

// -- tests --------------------------------------------------------------------------------------------------------

describe('activation', () => {
  test('starts diffgemma-lsp over stdio by default', async () => {
    const { client } = await activate();
    assert.equal(seen.clients.length, 1);
    assert.equal(client.id, 'diffgemma');
    assert.deepEqual(client.serverOptions, { command: 'diffgemma-lsp', args: [], transport: 0 });
    assert.equal(client.state, State.Running);
  });

  test('server command and args come from diffgemma.serverPath and diffgemma.serverArgs', async () => {
    userSettings = {
      serverPath: '~/venv/bin/diffgemma-lsp',
      serverArgs: ['--engine-socket', '${workspaceFolder}/dg.sock', '--model', '/models/dg'],
    };
    vscodeMock.workspace.workspaceFolders = [{ uri: { fsPath: '/ws' } }];
    const { client } = await activate();
    const home = require('node:os').homedir();
    assert.equal(client.serverOptions.command, `${home}/venv/bin/diffgemma-lsp`);
    assert.deepEqual(client.serverOptions.args, ['--engine-socket', '/ws/dg.sock', '--model', '/models/dg']);
    assert.equal(client.serverOptions.transport, languageClientMock.TransportKind.stdio);
  });

  test('every file, saved or untitled, whatever its language', async () => {
    const { client } = await activate();
    assert.deepEqual(client.clientOptions.documentSelector, [{ scheme: 'file' }, { scheme: 'untitled' }]);
  });

  test('initializationOptions carry the server settings, not the extension-only ones', async () => {
    userSettings = { debounceMs: 10, extraContextTokens: 0, model: '', serverPath: '/x/diffgemma-lsp' };
    const { client } = await activate();
    let options = client.clientOptions.initializationOptions;
    if (typeof options === 'function') options = options();
    const expected = { ...defaults(), debounceMs: 10, extraContextTokens: 0, model: null };
    delete expected.serverPath;
    delete expected.serverArgs;
    assert.deepEqual(options, { diffgemma: expected });
  });

  test('settings changes reach the server (configurationSection, filtered by the middleware)', async () => {
    userSettings = { deadlineMs: 500 };
    const { client } = await activate();
    assert.equal(client.clientOptions.synchronize.configurationSection, 'diffgemma');
    await client.clientOptions.middleware.workspace.didChangeConfiguration(['diffgemma'], async () => {
      assert.fail('the unfiltered section must not be sent');
    });
    const [sent] = client.notifications;
    assert.equal(sent.method, 'workspace/didChangeConfiguration');
    assert.equal(sent.params.settings.diffgemma.deadlineMs, 500);
    assert.equal('serverPath' in sent.params.settings.diffgemma, false);
    assert.equal('serverArgs' in sent.params.settings.diffgemma, false);
  });

  test('logs go to an output channel that the client also uses', async () => {
    const { client } = await activate();
    const [channel] = seen.outputChannels;
    assert.equal(client.clientOptions.outputChannel, channel);
    assert.deepEqual(channel.options, { log: true });
    assert.ok(channel.lines.some((line) => line.includes('diffgemma-lsp --stdio')), channel.lines.join('\n'));
  });

  test('registers the contributed commands', async () => {
    await activate();
    const contributed = PACKAGE_JSON.contributes.commands.map((command) => command.command).sort();
    assert.deepEqual([...seen.commands.keys()].sort(), contributed);
    assert.ok(seen.commands.has('diffgemma.restart'));
    assert.ok(seen.commands.has('diffgemma.showStatus'));
    // The server's own command is registered by vscode-languageclient: the extension must not take its name.
    assert.equal(seen.commands.has('diffgemma.status'), false);
  });

  test('a server that does not start: error status and a message pointing at serverPath', async () => {
    seen.failStart = 'spawn diffgemma-lsp ENOENT';
    const { item } = await activate();
    assert.equal(item.text, '$(error) DG');
    assert.match(item.tooltip, /ENOENT/);
    assert.match(seen.errors[0][0], /diffgemma\.serverPath/);
  });
});

describe('status bar', () => {
  test('shows the engine state, then the latency after an inline completion', async () => {
    serverStatus = { engine: 'loading', model: '', lastLatencyMs: null };
    const { client, controller, item } = await activate();
    assert.equal(item.visible, true);
    assert.equal(item.command, 'diffgemma.showStatus');
    await controller.refreshStatus();
    assert.equal(item.text, '$(sync~spin) DG loading');

    serverStatus = {
      engine: 'ready',
      model: 'memorized-test',
      lastLatencyMs: 41.6,
      lastTimings: { queue_ms: 1, encode_ms: 5, denoise_ms: 30, steps: 4, new_tokens: 9, cached_tokens: 0 },
    };
    const items = [{ insertText: 'x' }];
    const result = await client.clientOptions.middleware.provideInlineCompletionItems(
      fakeEditor('', { line: 0, character: 0 }).document,
      new Position(0, 0),
      {},
      {},
      async () => items,
    );
    assert.equal(result, items, 'the middleware passes the result through');
    for (let i = 0; i < 50 && item.text !== '$(sparkle) DG 42 ms'; i++) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    assert.equal(item.text, '$(sparkle) DG 42 ms');
    assert.match(item.tooltip, /engine ready/);
    assert.match(item.tooltip, /Model: memorized-test/);
    assert.match(item.tooltip, /denoise 30 ms; 4 steps/);
    const statusRequests = client.requests.filter((r) => r.params.command === 'diffgemma.status');
    assert.ok(statusRequests.length >= 2);
    assert.deepEqual(statusRequests[0], {
      method: 'workspace/executeCommand',
      params: { command: 'diffgemma.status', arguments: [] },
    });
  });

  test('describeStatus covers each state', () => {
    const view = (input) => describeStatus({ phase: 'running', enabled: true, ...input });
    assert.equal(view({ status: { engine: 'ready', lastLatencyMs: null } }).text, '$(sparkle) DG ready');
    assert.equal(view({ status: { engine: 'ready', lastLatencyMs: 1234.4 } }).text, '$(sparkle) DG 1234 ms');
    assert.equal(view({ status: { engine: 'connecting' } }).text, '$(sync~spin) DG starting');
    assert.equal(view({ status: { engine: 'not started' } }).text, '$(sync~spin) DG starting');
    assert.equal(view({ status: { engine: 'disconnected' } }).text, '$(warning) DG disconnected');
    assert.equal(view({ status: { engine: 'failed' } }).severity, 'warning');
    assert.equal(view({ status: undefined }).text, '$(sync~spin) DG');
    assert.equal(view({ enabled: false, status: { engine: 'ready' } }).text, '$(circle-slash) DG off');
    assert.equal(view({ phase: 'stopped' }).text, '$(circle-slash) DG off');
    assert.equal(view({ phase: 'failed', error: 'boom' }).severity, 'error');
  });

  test('polls while the engine starts or reconnects, not once it is ready', () => {
    assert.equal(pollDelayMs(undefined), 2000);
    assert.equal(pollDelayMs({ engine: 'loading' }), 2000);
    assert.equal(pollDelayMs({ engine: 'disconnected' }), 2000);
    assert.equal(pollDelayMs({ engine: 'failed' }), 5000);
    assert.equal(pollDelayMs({ engine: 'ready' }), undefined);
  });

  test('keeps polling while the engine loads, and stops once it is ready', async () => {
    serverStatus = { engine: 'loading' };
    const { client, controller, item } = await activate();
    await controller.refreshStatus();
    assert.equal(item.text, '$(sync~spin) DG loading');
    const before = client.requests.length;
    serverStatus = { engine: 'ready', lastLatencyMs: null };
    for (let i = 0; i < 100 && item.text !== '$(sparkle) DG ready'; i++) {
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    assert.equal(item.text, '$(sparkle) DG ready', 'the poll picked up the ready engine');
    assert.ok(client.requests.length > before);
    const settled = client.requests.length;
    await new Promise((resolve) => setTimeout(resolve, 2300));
    assert.equal(client.requests.length, settled, 'no polling once ready');
  });
});

describe('lifecycle', () => {
  test('deactivate stops the client', async () => {
    const { client, item } = await activate();
    await extension.deactivate();
    assert.equal(client.stopped, true);
    assert.equal(item.disposed, true);
  });

  test('diffgemma.restart stops the client and starts a new one', async () => {
    const { client } = await activate();
    await seen.commands.get('diffgemma.restart')();
    assert.equal(client.stopped, true);
    assert.equal(seen.clients.length, 2);
    assert.equal(seen.clients[1].state, State.Running);
  });

  test('changing serverPath restarts the server; other settings do not', async () => {
    await activate();
    const change = (key) => ({ affectsConfiguration: (section) => section === 'diffgemma' || section === key });
    seen.configListeners[0](change('diffgemma.deadlineMs'));
    await tick();
    assert.equal(seen.clients.length, 1);
    userSettings = { serverPath: '/opt/dg/bin/diffgemma-lsp' };
    seen.configListeners[0](change('diffgemma.serverPath'));
    for (let i = 0; i < 50 && seen.clients.length < 2; i++) await tick();
    assert.equal(seen.clients.length, 2);
    assert.equal(seen.clients[1].serverOptions.command, '/opt/dg/bin/diffgemma-lsp');
  });

  test('showStatus offers restart, log and settings', async () => {
    await activate();
    await seen.commands.get('diffgemma.showStatus')();
    const labels = seen.quickPicks[0].items.map((item) => item.label);
    assert.ok(labels.includes('DiffusionGemma: engine ready'), labels.join('\n'));
    assert.ok(labels.some((label) => label.includes('Restart')));
    assert.ok(labels.some((label) => label.includes('log')));
  });
});

describe('rewrite selection with instruction', () => {
  /** A fake editor whose selection runs from anchor to active (either may come first, as in VS Code). */
  function fakeEditor({ uri = 'file:///ws/example.py', version = 7, anchor = [1, 0], active = [2, 16] } = {}) {
    const pos = ([line, character]) => ({ line, character });
    const [a, b] = [pos(anchor), pos(active)];
    const before = a.line < b.line || (a.line === b.line && a.character <= b.character);
    const selection = {
      anchor: a,
      active: b,
      start: before ? a : b,
      end: before ? b : a,
      isEmpty: a.line === b.line && a.character === b.character,
    };
    return { document: { uri: { toString: () => uri }, version }, selection };
  }

  const rewriteRequests = (client) =>
    client.requests.filter((request) => request.params.command === 'diffgemma.rewriteSelection');

  test('asks for an instruction, then sends diffgemma.rewriteSelection {uri, range, version, instruction}', async () => {
    const { client, controller } = await activate();
    vscodeMock.window.activeTextEditor = fakeEditor();
    inputBoxAnswer = '  use a - b  ';
    const result = await seen.commands.get('diffgemma.rewriteSelectionWithInstruction')();
    assert.equal(seen.inputBoxes.length, 1);
    assert.match(seen.inputBoxes[0].title, /Rewrite selection/);
    assert.deepEqual(rewriteRequests(client), [
      {
        method: 'workspace/executeCommand',
        params: {
          command: 'diffgemma.rewriteSelection',
          arguments: [
            {
              uri: 'file:///ws/example.py',
              range: { start: { line: 1, character: 0 }, end: { line: 2, character: 16 } },
              version: 7,
              instruction: 'use a - b',
            },
          ],
        },
      },
    ]);
    assert.deepEqual(result, { applied: true, reason: '' });
    assert.ok(controller.output.lines.some((line) => line.includes('rewrite: applied')), controller.output.lines);
  });

  test('a selection made backwards (cursor before the anchor) sends the same ordered range', async () => {
    const { client } = await activate();
    vscodeMock.window.activeTextEditor = fakeEditor({ anchor: [2, 16], active: [1, 0] });
    inputBoxAnswer = 'x';
    await seen.commands.get('diffgemma.rewriteSelectionWithInstruction')();
    const [request] = rewriteRequests(client);
    assert.deepEqual(request.params.arguments[0].range, {
      start: { line: 1, character: 0 },
      end: { line: 2, character: 16 },
    });
  });

  test('an empty instruction is left out (the model re-fills the selection)', async () => {
    const { client } = await activate();
    vscodeMock.window.activeTextEditor = fakeEditor();
    inputBoxAnswer = '   ';
    await seen.commands.get('diffgemma.rewriteSelectionWithInstruction')();
    const [request] = rewriteRequests(client);
    assert.equal('instruction' in request.params.arguments[0], false);
  });

  test('the version is the one when the command started, not after the input box', async () => {
    const { client } = await activate();
    const editor = fakeEditor({ version: 3 });
    vscodeMock.window.activeTextEditor = editor;
    inputBoxAnswer = () => {
      editor.document.version = 4; // the user typed while the box was open
      return 'x';
    };
    rewriteAnswer = { applied: false, reason: 'the document changed while the rewrite ran' };
    const result = await seen.commands.get('diffgemma.rewriteSelectionWithInstruction')();
    assert.equal(rewriteRequests(client)[0].params.arguments[0].version, 3);
    assert.deepEqual(result, rewriteAnswer);
  });

  test('Escape in the input box sends nothing', async () => {
    const { client } = await activate();
    vscodeMock.window.activeTextEditor = fakeEditor();
    inputBoxAnswer = undefined;
    assert.equal(await seen.commands.get('diffgemma.rewriteSelectionWithInstruction')(), undefined);
    assert.deepEqual(rewriteRequests(client), []);
  });

  test('no editor or an empty selection: a message, no input box, nothing sent', async () => {
    const { client } = await activate();
    await seen.commands.get('diffgemma.rewriteSelectionWithInstruction')();
    vscodeMock.window.activeTextEditor = fakeEditor({ anchor: [1, 4], active: [1, 4] });
    await seen.commands.get('diffgemma.rewriteSelectionWithInstruction')();
    assert.equal(seen.inputBoxes.length, 0);
    assert.equal(seen.infos.length, 2);
    assert.match(seen.infos[0][0], /select the code/);
    assert.deepEqual(rewriteRequests(client), []);
  });

  test('a server that is not running: a warning, nothing sent', async () => {
    seen.failStart = 'spawn diffgemma-lsp ENOENT';
    await activate();
    vscodeMock.window.activeTextEditor = fakeEditor();
    inputBoxAnswer = 'x';
    await seen.commands.get('diffgemma.rewriteSelectionWithInstruction')();
    assert.match(seen.warnings[0][0], /not running/);
  });

  test('a failing request: an error message and the log, no exception', async () => {
    const { controller } = await activate();
    vscodeMock.window.activeTextEditor = fakeEditor();
    inputBoxAnswer = 'x';
    rewriteAnswer = new Error('Request failed: no engine');
    assert.equal(await seen.commands.get('diffgemma.rewriteSelectionWithInstruction')(), undefined);
    assert.match(seen.errors.at(-1)[0], /no engine/);
    assert.ok(controller.output.lines.some((line) => line.startsWith('error: rewrite failed')));
  });

  test('rewriteArgument: empty ranges give nothing; the range is copied, not shared', () => {
    const range = { start: { line: 0, character: 2 }, end: { line: 0, character: 2 } };
    assert.equal(rewriteArgument('file:///a', 1, range, 'x'), undefined);
    const span = { start: { line: 0, character: 0 }, end: { line: 3, character: 1 } };
    const argument = rewriteArgument('file:///a', 1, span);
    assert.deepEqual(argument, { uri: 'file:///a', range: span, version: 1 });
    assert.notEqual(argument.range.start, span.start);
  });

  test('asRewriteResult takes {applied, reason} and nothing else', () => {
    assert.deepEqual(asRewriteResult({ applied: false, reason: 'stale' }), { applied: false, reason: 'stale' });
    assert.deepEqual(asRewriteResult({ applied: true }), { applied: true, reason: '' });
    assert.equal(asRewriteResult(null), undefined);
    assert.equal(asRewriteResult({ applied: 'yes' }), undefined);
  });
});

describe('next edits', () => {
  const RENAMED = 'def area(size, height):\n    return width * height\n\n\nprint(area(2, 3))\n';
  const FOLLOWED = 'def area(size, height):\n    return size * height\n\n\nprint(area(2, 3))\n';
  const URI = 'file:///work/area.py';
  const answer = (version, edits) => ({ uri: URI, version, edits });
  const USE = { range: { start: { line: 1, character: 0 }, end: { line: 2, character: 0 } }, newText: '    return size * height\n' };

  test('asSuggestion takes a well-formed answer for the version asked, nothing else', () => {
    assert.deepEqual(asSuggestion(answer(3, [USE]), URI, 3), { uri: URI, version: 3, edits: [USE] });
    assert.equal(asSuggestion(null, URI, 3), undefined);
    assert.equal(asSuggestion(answer(2, [USE]), URI, 3), undefined); // typed since
    assert.equal(asSuggestion({ ...answer(3, [USE]), uri: 'file:///other.py' }, URI, 3), undefined);
    assert.equal(asSuggestion(answer(3, []), URI, 3), undefined);
    const reversed = { range: { start: USE.range.end, end: USE.range.start }, newText: '' };
    assert.equal(asSuggestion(answer(3, [reversed]), URI, 3), undefined);
    assert.equal(asSuggestion(answer(3, [USE, USE]), URI, 3), undefined); // overlapping
    assert.equal(asSuggestion(answer(3, [{ range: USE.range, newText: 7 }]), URI, 3), undefined);
  });

  test('drawing: a replaced line struck through with its new line after it; inserted and deleted lines', () => {
    const lines = RENAMED.split('\n');
    const lineAt = (line) => lines[line];
    assert.deepEqual(drawing([USE], lineAt), {
      deletions: [{ start: { line: 1, character: 0 }, end: { line: 1, character: 25 } }],
      insertions: [{ at: { line: 1, character: 25 }, text: '    return size * height' }],
    });
    const insert = { range: { start: { line: 2, character: 0 }, end: { line: 2, character: 0 } }, newText: 'a\nb\n' };
    assert.deepEqual(drawing([insert], lineAt), {
      deletions: [],
      insertions: [{ at: { line: 1, character: 25 }, text: '⏎ a ⏎ b' }],
    });
    const remove = { range: { start: { line: 2, character: 0 }, end: { line: 4, character: 0 } }, newText: '' };
    assert.deepEqual(drawing([remove], lineAt).insertions, []);
    assert.equal(drawing([remove], lineAt).deletions.length, 2);
    const grow = { range: USE.range, newText: 'x\ny\n' };
    assert.deepEqual(drawing([grow], lineAt).insertions, [{ at: { line: 1, character: 25 }, text: 'x ⏎ y' }]);
  });

  test('insertionAtCursor: one insertion at the cursor is an inline completion', () => {
    const at = { range: { start: { line: 4, character: 6 }, end: { line: 4, character: 6 } }, newText: 'max' };
    assert.equal(insertionAtCursor({ uri: URI, version: 1, edits: [at] }, { line: 4, character: 6 }), 'max');
    assert.equal(insertionAtCursor({ uri: URI, version: 1, edits: [at] }, { line: 4, character: 5 }), undefined);
    assert.equal(insertionAtCursor({ uri: URI, version: 1, edits: [USE] }, { line: 1, character: 0 }), undefined);
  });

  test('a pause after an edit asks at the cursor; Tab applies the suggestion in one undo step', async () => {
    const { controller, client } = await activate();
    const editor = fakeEditor(RENAMED, { line: 0, character: 13 }, URI);
    vscodeMock.window.activeTextEditor = editor;
    nextEditAnswer = (params) => answer(params.textDocument.version, [USE]);
    for (const listener of seen.changeListeners) listener({ document: editor.document, contentChanges: [{}] });
    assert.equal(client.requests.filter((request) => request.method === 'diffgemma/nextEdit').length, 0);
    await new Promise((resolve) => setTimeout(resolve, ASK_DELAY_MS + 100));
    const asked = client.requests.filter((request) => request.method === 'diffgemma/nextEdit');
    assert.deepEqual(asked.map((request) => request.params), [
      { textDocument: { uri: URI, version: 1 }, position: { line: 0, character: 13 } },
    ]);
    const [removed, added] = seen.decorationTypes;
    assert.equal(removed.options.textDecoration, 'line-through');
    assert.deepEqual(editor.decorations.get(removed).map((range) => [range.start.line, range.end.character]), [[1, 25]]);
    const [ghost] = editor.decorations.get(added);
    assert.equal(ghost.renderOptions.after.contentText, '  return size * height');
    assert.deepEqual(seen.executed.at(-1), ['setContext', VISIBLE_CONTEXT, true]);

    assert.equal(await seen.commands.get('diffgemma.acceptNextEdit')(), true);
    assert.equal(editor.document.text, FOLLOWED);
    assert.equal(editor.edits.length, 1); // one edit: one undo step
    assert.deepEqual(editor.edits[0].options, { undoStopBefore: true, undoStopAfter: true });
    assert.deepEqual(editor.decorations.get(removed), []);
    assert.deepEqual(seen.executed.at(-1), ['setContext', VISIBLE_CONTEXT, false]);
    assert.equal(await seen.commands.get('diffgemma.acceptNextEdit')(), false); // nothing left to apply
    assert.ok(controller.nextEdits.current() === undefined);

    const output = fakeEditor('log line', { line: 0, character: 0 }, 'output:extension-output');
    vscodeMock.window.activeTextEditor = output;
    const before = client.requests.length;
    for (const listener of seen.changeListeners) listener({ document: output.document, contentChanges: [{}] });
    await new Promise((resolve) => setTimeout(resolve, ASK_DELAY_MS + 100));
    assert.equal(client.requests.length, before); // not a document the server has: nothing asked
  });

  test('a jump (a chain\'s next place): scrolled into view, hinted at the cursor; Tab applies it and moves there', async () => {
    const CHAIN = 'def summed(items):\n    return sum(items)\n\n\nfirst = total([1, 2])\n';
    const PLACE = { range: { start: { line: 4, character: 0 }, end: { line: 5, character: 0 } }, newText: 'first = summed([1, 2])\n' };
    assert.deepEqual(asSuggestion({ ...answer(3, [PLACE]), jump: true }, URI, 3), { uri: URI, version: 3, edits: [PLACE], jump: true });
    assert.equal(asSuggestion({ ...answer(3, [PLACE]), jump: 'yes' }, URI, 3).jump, undefined);
    const { controller } = await activate();
    const editor = fakeEditor(CHAIN, { line: 0, character: 10 }, URI);
    vscodeMock.window.activeTextEditor = editor;
    nextEditAnswer = (params) => ({ ...answer(params.textDocument.version, [PLACE]), jump: true });
    assert.ok(await controller.nextEdits.ask(editor));
    const hint = seen.decorationTypes[2];
    const [shown] = editor.decorations.get(hint);
    assert.equal(shown.renderOptions.after.contentText, '  Tab: line 5');
    assert.deepEqual([shown.range.start.line, shown.range.start.character], [0, 10]); // at the cursor
    assert.deepEqual(editor.revealed.map(({ range, how }) => [range.start.line, how]), [[4, 2]]);
    assert.equal(await seen.commands.get('diffgemma.acceptNextEdit')(), true);
    assert.equal(editor.document.text, CHAIN.replace('total', 'summed'));
    assert.deepEqual([editor.selection.active.line, editor.selection.active.character], [4, 0]); // taken there
    assert.deepEqual(editor.decorations.get(hint), []);
  });

  test('an answer for a version the user has typed past is not shown; Escape and a change dismiss', async () => {
    const { controller } = await activate();
    const editor = fakeEditor(RENAMED, { line: 0, character: 13 }, URI);
    vscodeMock.window.activeTextEditor = editor;
    nextEditAnswer = (params) => {
      editor.document.version += 1; // a keystroke lands while the server works
      return answer(params.textDocument.version, [USE]);
    };
    assert.equal(await controller.nextEdits.ask(editor), undefined);
    assert.equal(seen.executed.some(([command]) => command === 'setContext'), false);

    nextEditAnswer = (params) => answer(params.textDocument.version, [USE]);
    assert.ok(await controller.nextEdits.ask(editor));
    await seen.commands.get('diffgemma.dismissNextEdit')();
    assert.equal(controller.nextEdits.current(), undefined);
    assert.equal(await seen.commands.get('diffgemma.acceptNextEdit')(), false);
    assert.equal(editor.document.text, RENAMED);

    assert.ok(await controller.nextEdits.ask(editor));
    for (const listener of seen.changeListeners) listener({ document: editor.document, contentChanges: [{}] });
    assert.equal(controller.nextEdits.current(), undefined); // typing dismisses
    nextEditAnswer = null;
    assert.equal(await controller.nextEdits.ask(editor), undefined); // null: no suggestion
  });

  test('an insertion at the cursor is offered as an inline completion; none asked over a shown completion', async () => {
    const { controller, client } = await activate();
    const editor = fakeEditor(RENAMED, { line: 4, character: 6 }, URI);
    vscodeMock.window.activeTextEditor = editor;
    const insert = { range: { start: { line: 4, character: 6 }, end: { line: 4, character: 6 } }, newText: 'max' };
    nextEditAnswer = (params) => answer(params.textDocument.version, [insert]);
    assert.ok(await controller.nextEdits.ask(editor));
    assert.deepEqual(seen.executed.at(-1), ['editor.action.inlineSuggest.trigger']);
    const provide = client.clientOptions.middleware.provideInlineCompletionItems;
    const items = await provide(editor.document, new Position(4, 6), {}, {}, async () => []);
    assert.deepEqual(items.map((item) => item.insertText), ['max']);
    assert.deepEqual(await provide(editor.document, new Position(4, 5), {}, {}, async () => []), []);

    await provide(editor.document, new Position(4, 6), {}, {}, async () => [{ insertText: 'x' }]);
    const before = client.requests.length;
    assert.equal(await controller.nextEdits.ask(editor), undefined); // a completion is on screen at this version
    assert.equal(client.requests.length, before);
  });
});

describe('package.json', () => {
  test('name, publisher, engine and entry point', () => {
    assert.equal(PACKAGE_JSON.name, 'diffgemma');
    assert.equal(PACKAGE_JSON.publisher, 'diffgemma');
    assert.equal(PACKAGE_JSON.engines.vscode, '^1.100.0');
    assert.equal(PACKAGE_JSON.main, './out/extension.js');
  });

  test('the instruction command is contributed with its title, and in the editor menu on a selection', () => {
    const command = PACKAGE_JSON.contributes.commands.find(
      (entry) => entry.command === 'diffgemma.rewriteSelectionWithInstruction',
    );
    assert.equal(`${command.category}: ${command.title}`, 'DiffusionGemma: Rewrite selection with instruction...');
    assert.deepEqual(PACKAGE_JSON.contributes.menus['editor/context'], [
      { command: 'diffgemma.rewriteSelectionWithInstruction', when: 'editorHasSelection', group: '1_modification' },
    ]);
  });

  test('Tab applies a next edit and Escape dismisses it only while one is shown', () => {
    const bindings = PACKAGE_JSON.contributes.keybindings;
    const tab = bindings.find((binding) => binding.command === 'diffgemma.acceptNextEdit');
    assert.equal(tab.key, 'tab');
    assert.match(tab.when, /diffgemma\.nextEditVisible/);
    assert.match(tab.when, /!inlineSuggestionVisible/); // an inline completion's own Tab wins
    const escape = bindings.find((binding) => binding.command === 'diffgemma.dismissNextEdit');
    assert.equal(escape.key, 'escape');
    assert.match(escape.when, /diffgemma\.nextEditVisible/);
    const commands = PACKAGE_JSON.contributes.commands.map((command) => command.command);
    assert.ok(commands.includes('diffgemma.acceptNextEdit') && commands.includes('diffgemma.dismissNextEdit'));
  });

  test('the rewrite settings', () => {
    const properties = PACKAGE_JSON.contributes.configuration.properties;
    assert.equal(properties['diffgemma.rewriteEnabled'].default, true);
    assert.equal(properties['diffgemma.rewriteStrength'].default, 0.6);
    assert.equal(properties['diffgemma.rewriteStrength'].exclusiveMinimum, 0);
    assert.equal(properties['diffgemma.rewriteStrength'].maximum, 1);
    assert.equal(properties['diffgemma.rewriteSteps'].default, 0);
  });

  test('server settings are the contributed ones less serverPath/serverArgs', () => {
    const keys = serverSettingKeys(PACKAGE_JSON);
    assert.ok(keys.includes('debounceMs'));
    assert.equal(keys.includes('serverPath'), false);
    assert.equal(keys.includes('serverArgs'), false);
    for (const [name, schema] of Object.entries(PACKAGE_JSON.contributes.configuration.properties)) {
      assert.ok(schema.description || schema.markdownDescription, `${name} has no description`);
    }
  });

  test('serverCommand falls back to diffgemma-lsp and drops non-string args', () => {
    const config = (values) => ({ get: (key) => values[key] });
    assert.deepEqual(serverCommand(config({ serverPath: '  ', serverArgs: ['-v', 3] }), '/home/u'), {
      command: 'diffgemma-lsp',
      args: ['-v'],
    });
  });
});
