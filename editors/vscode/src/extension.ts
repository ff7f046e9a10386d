/**
 * DiffusionGemma completions: starts `diffgemma-lsp` over stdio for every file, shows its inline completions as ghost
 * text (its completion items are the fallback in the suggest widget), and the engine's state and last latency in the
 * status bar. The server's code action "Rewrite selection" comes through the client as it is; the command
 * "Rewrite selection with instruction..." asks for an instruction first. Next edits: src/nextEditView.ts.
 */
import * as os from 'node:os';
import * as vscode from 'vscode';
import {
  DidChangeConfigurationNotification,
  ExecuteCommandRequest,
  type Executable,
  LanguageClient,
  type LanguageClientOptions,
  RevealOutputChannelOn,
  State,
  TransportKind,
} from 'vscode-languageclient/node';
import { type PackageJson, SECTION, serverCommand, serverSettingKeys, serverSettings } from './config';
import { NEXT_EDIT_COMMANDS, NextEditView } from './nextEditView';
import { asRewriteResult, type RewriteResult, rewriteArgument, SERVER_REWRITE_COMMAND } from './rewrite';
import { type ClientPhase, describeStatus, pollDelayMs, type ServerStatus } from './status';

/** The server's own command (diffgemma_lsp/server.py); vscode-languageclient also registers it as a VS Code command. */
export const SERVER_STATUS_COMMAND = 'diffgemma.status';
export const COMMANDS = {
  restart: 'diffgemma.restart',
  showStatus: 'diffgemma.showStatus',
  showLog: 'diffgemma.showLog',
  /** Not the server's `diffgemma.rewriteSelection`: vscode-languageclient registers that name itself. */
  rewriteWithInstruction: 'diffgemma.rewriteSelectionWithInstruction',
} as const;
const CLIENT_ID = 'diffgemma';
const CLIENT_NAME = 'DiffusionGemma';
/** Coalesces the status requests of a burst of completions (one request per keystroke otherwise). */
const REFRESH_DELAY_MS = 100;

function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

export class Controller implements vscode.Disposable {
  readonly output: vscode.LogOutputChannel;
  readonly statusItem: vscode.StatusBarItem;
  readonly nextEdits: NextEditView;
  client: LanguageClient | undefined;
  private readonly keys: string[];
  private phase: ClientPhase = 'stopped';
  private status: ServerStatus | undefined;
  private startError: string | undefined;
  private refreshTimer: ReturnType<typeof setTimeout> | undefined;
  private refreshing = false;
  private refreshAgain = false;
  private disposed = false;
  /** Serialises start/stop/restart. */
  private lifecycle: Promise<void> = Promise.resolve();

  constructor(packageJson: PackageJson) {
    this.keys = serverSettingKeys(packageJson);
    this.output = vscode.window.createOutputChannel(CLIENT_NAME, { log: true });
    this.statusItem = vscode.window.createStatusBarItem('diffgemma.status', vscode.StatusBarAlignment.Right, 100);
    this.statusItem.name = CLIENT_NAME;
    this.statusItem.command = COMMANDS.showStatus;
    this.nextEdits = new NextEditView(
      () => this.client,
      () => this.enabled() && this.config().get<boolean>('nextEditEnabled') !== false,
      this.output,
    );
    this.render();
    this.statusItem.show();
  }

  private config(): vscode.WorkspaceConfiguration {
    return vscode.workspace.getConfiguration(SECTION);
  }

  private enabled(): boolean {
    return this.config().get<boolean>('enable') !== false;
  }

  /** The settings for the server, from the `diffgemma` section less the extension's own keys. */
  settingsForServer(): Record<string, unknown> {
    return serverSettings(this.config(), this.keys);
  }

  clientOptions(): LanguageClientOptions {
    return {
      documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
      // A function: a restarted client sends the settings of the moment.
      initializationOptions: () => ({ [SECTION]: this.settingsForServer() }),
      synchronize: { configurationSection: SECTION },
      outputChannel: this.output,
      revealOutputChannelOn: RevealOutputChannelOn.Never,
      middleware: {
        provideInlineCompletionItems: async (document, position, context, token, next) => {
          try {
            const found = await next(document, position, context, token);
            const items = Array.isArray(found) ? found : (found?.items ?? []);
            if (items.length) {
              this.nextEdits.completionOffered(document);
            }
            const nextEdit = this.nextEdits.inlineAt(document, position);
            return nextEdit ? [nextEdit, ...items] : found;
          } finally {
            this.refreshStatusSoon();
          }
        },
        provideCompletionItem: async (document, position, context, token, next) => {
          try {
            return await next(document, position, context, token);
          } finally {
            this.refreshStatusSoon();
          }
        },
        workspace: {
          // Send the server its own keys only: the section also holds serverPath/serverArgs.
          didChangeConfiguration: async () => {
            const client = this.client;
            if (client?.state === State.Running) {
              await client.sendNotification(DidChangeConfigurationNotification.type, {
                settings: { [SECTION]: this.settingsForServer() },
              });
            }
          },
        },
      },
    };
  }

  serverOptions(): Executable {
    const folder = vscode.workspace.workspaceFolders?.[0]?.uri.fsPath;
    const { command, args } = serverCommand(this.config(), os.homedir(), folder);
    return { command, args, transport: TransportKind.stdio };
  }

  start(): Promise<void> {
    return this.queue(() => this.doStart());
  }

  stop(): Promise<void> {
    return this.queue(() => this.doStop());
  }

  restart(): Promise<void> {
    return this.queue(async () => {
      this.output.info('restarting the language server');
      await this.doStop();
      await this.doStart();
    });
  }

  private queue(step: () => Promise<void>): Promise<void> {
    this.lifecycle = this.lifecycle.then(step, step);
    return this.lifecycle;
  }

  private async doStart(): Promise<void> {
    if (this.disposed || this.client) {
      return;
    }
    const serverOptions = this.serverOptions();
    this.output.info(`starting ${[serverOptions.command, ...(serverOptions.args ?? [])].join(' ')} --stdio`);
    const client = new LanguageClient(CLIENT_ID, CLIENT_NAME, serverOptions, this.clientOptions());
    this.client = client;
    this.status = undefined;
    this.startError = undefined;
    this.setPhase('starting');
    client.onDidChangeState((event) => {
      if (this.client !== client) {
        return;
      }
      if (event.newState === State.Running) {
        this.setPhase('running');
        this.refreshStatusSoon();
      } else if (event.newState === State.Stopped && this.phase !== 'failed') {
        this.setPhase('stopped');
      }
    });
    try {
      await client.start();
    } catch (error) {
      if (this.client !== client) {
        return;
      }
      this.startError = errorText(error);
      this.setPhase('failed');
      this.output.error(`the language server did not start: ${this.startError}`);
      void vscode.window
        .showErrorMessage(
          `DiffusionGemma: could not start the language server (${this.startError}). Is diffgemma-lsp installed? ` +
            'Set "diffgemma.serverPath" to its full path.',
          'Open Settings',
          'Show Log',
        )
        .then((choice) => {
          if (choice === 'Open Settings') {
            void vscode.commands.executeCommand('workbench.action.openSettings', 'diffgemma.serverPath');
          } else if (choice === 'Show Log') {
            this.output.show();
          }
        });
    }
  }

  private async doStop(): Promise<void> {
    this.clearRefreshTimer();
    const client = this.client;
    this.client = undefined;
    if (client) {
      try {
        await client.stop(2000);
      } catch (error) {
        this.output.warn(`stopping the language server: ${errorText(error)}`);
      }
    }
    this.setPhase('stopped');
  }

  private setPhase(phase: ClientPhase): void {
    this.phase = phase;
    this.render();
  }

  private render(): void {
    if (this.disposed) {
      return;
    }
    const view = describeStatus({
      phase: this.phase,
      enabled: this.enabled(),
      status: this.status,
      error: this.startError,
    });
    this.statusItem.text = view.text;
    this.statusItem.tooltip = view.tooltip;
    this.statusItem.accessibilityInformation = { label: view.text.replace(/\$\([^)]*\)\s*/g, '') };
    this.statusItem.backgroundColor =
      view.severity === 'error'
        ? new vscode.ThemeColor('statusBarItem.errorBackground')
        : view.severity === 'warning'
          ? new vscode.ThemeColor('statusBarItem.warningBackground')
          : undefined;
  }

  private clearRefreshTimer(): void {
    if (this.refreshTimer !== undefined) {
      clearTimeout(this.refreshTimer);
      this.refreshTimer = undefined;
    }
  }

  /** Ask the server for its status after `delayMs`, unless a request is already scheduled sooner. */
  refreshStatusSoon(delayMs = REFRESH_DELAY_MS): void {
    if (this.disposed) {
      return;
    }
    this.clearRefreshTimer();
    this.refreshTimer = setTimeout(() => {
      this.refreshTimer = undefined;
      void this.refreshStatus();
    }, delayMs);
  }

  /** `workspace/executeCommand diffgemma.status`, then re-render; polls while the engine is starting or down. */
  async refreshStatus(): Promise<ServerStatus | undefined> {
    const client = this.client;
    if (!client || client.state !== State.Running) {
      return undefined;
    }
    if (this.refreshing) {
      this.refreshAgain = true;
      return this.status;
    }
    this.refreshing = true;
    try {
      const result = (await client.sendRequest(ExecuteCommandRequest.type, {
        command: SERVER_STATUS_COMMAND,
        arguments: [],
      })) as ServerStatus | null;
      if (this.client === client && result && typeof result.engine === 'string') {
        this.status = result;
        this.render();
      }
    } catch (error) {
      this.output.debug(`status request failed: ${errorText(error)}`);
    } finally {
      this.refreshing = false;
    }
    if (this.refreshAgain) {
      this.refreshAgain = false;
      this.refreshStatusSoon();
    } else if (this.client === client && this.refreshTimer === undefined && this.enabled()) {
      const delay = pollDelayMs(this.status);
      if (delay !== undefined) {
        this.refreshStatusSoon(delay);
      }
    }
    return this.status;
  }

  /** Status in a quick pick, with restart, log and settings. */
  async showStatus(): Promise<void> {
    await this.refreshStatus();
    const view = describeStatus({
      phase: this.phase,
      enabled: this.enabled(),
      status: this.status,
      error: this.startError,
    });
    const info = view.tooltip.split('\n').slice(0, -1); // the last line is "Click for ..."
    type Item = vscode.QuickPickItem & { run?: () => unknown };
    const items: Item[] = [
      ...info.map((label) => ({ label })),
      { label: '', kind: vscode.QuickPickItemKind.Separator },
      { label: '$(debug-restart) Restart the language server', run: () => this.restart() },
      { label: '$(output) Show the log', run: () => this.output.show() },
      {
        label: '$(gear) Open the settings',
        run: () => vscode.commands.executeCommand('workbench.action.openSettings', '@ext:diffgemma.diffgemma'),
      },
    ];
    const choice = await vscode.window.showQuickPick(items, { title: CLIENT_NAME, placeHolder: view.text });
    await choice?.run?.();
  }

  /**
   * "Rewrite selection with instruction...": asks for an instruction, then runs the server's
   * `diffgemma.rewriteSelection` on the active editor's selection (the server shows the progress and applies the
   * edit). The selection and the document version are read before the input box opens: an edit made meanwhile makes
   * the server refuse the stale rewrite.
   */
  async rewriteWithInstruction(): Promise<RewriteResult | undefined> {
    const editor = vscode.window.activeTextEditor;
    if (!editor || editor.selection.isEmpty) {
      void vscode.window.showInformationMessage('DiffusionGemma: select the code to rewrite first.');
      return undefined;
    }
    const { document, selection } = editor;
    const version = document.version;
    const range = {
      start: { line: selection.start.line, character: selection.start.character },
      end: { line: selection.end.line, character: selection.end.character },
    };
    const instruction = await vscode.window.showInputBox({
      title: 'DiffusionGemma: Rewrite selection',
      prompt: 'How should the selection change? (Empty: the model re-fills it; FIM models ignore instructions.)',
      placeHolder: 'e.g. use a list comprehension',
      ignoreFocusOut: true,
    });
    if (instruction === undefined) {
      return undefined; // Escape
    }
    const client = this.client;
    if (!client || client.state !== State.Running) {
      void vscode.window.showWarningMessage('DiffusionGemma: the language server is not running.');
      return undefined;
    }
    const argument = rewriteArgument(client.code2ProtocolConverter.asUri(document.uri), version, range, instruction);
    if (!argument) {
      return undefined;
    }
    const how = argument.instruction ? ' with an instruction' : '';
    this.output.info(`rewrite ${argument.uri} at version ${version}${how}`);
    try {
      const answer = await client.sendRequest(ExecuteCommandRequest.type, {
        command: SERVER_REWRITE_COMMAND,
        arguments: [argument],
      });
      const result = asRewriteResult(answer);
      const outcome = result ? (result.applied ? 'applied' : `not applied (${result.reason})`) : 'no answer';
      this.output.info(`rewrite: ${outcome}`);
      return result;
    } catch (error) {
      this.output.error(`rewrite failed: ${errorText(error)}`);
      void vscode.window.showErrorMessage(`DiffusionGemma: the rewrite failed (${errorText(error)}).`);
      return undefined;
    } finally {
      this.refreshStatusSoon();
    }
  }

  /** Restart when the server's command line changed; the server takes the other settings by itself. */
  onConfigurationChanged(event: vscode.ConfigurationChangeEvent): void {
    if (
      event.affectsConfiguration(`${SECTION}.serverPath`) ||
      event.affectsConfiguration(`${SECTION}.serverArgs`)
    ) {
      void this.restart();
    } else if (event.affectsConfiguration(SECTION)) {
      this.render();
      this.refreshStatusSoon();
    }
  }

  dispose(): void {
    this.clearRefreshTimer();
    this.disposed = true;
    this.nextEdits.dispose();
    this.statusItem.dispose();
    this.output.dispose();
  }
}

let controller: Controller | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<Controller> {
  const current = new Controller(context.extension.packageJSON as PackageJson);
  controller = current;
  context.subscriptions.push(
    current.statusItem,
    current.output,
    vscode.commands.registerCommand(COMMANDS.restart, () => current.restart()),
    vscode.commands.registerCommand(COMMANDS.showStatus, () => current.showStatus()),
    vscode.commands.registerCommand(COMMANDS.showLog, () => current.output.show()),
    vscode.commands.registerCommand(COMMANDS.rewriteWithInstruction, () => current.rewriteWithInstruction()),
    vscode.workspace.onDidChangeConfiguration((event) => current.onConfigurationChanged(event)),
    vscode.commands.registerCommand(NEXT_EDIT_COMMANDS.accept, () => current.nextEdits.accept()),
    vscode.commands.registerCommand(NEXT_EDIT_COMMANDS.dismiss, () => current.nextEdits.dismiss()),
    vscode.workspace.onDidChangeTextDocument((event) => current.nextEdits.onDidChange(event)),
    vscode.window.onDidChangeActiveTextEditor(() => current.nextEdits.dismiss()),
  );
  await current.start();
  return current;
}

export async function deactivate(): Promise<void> {
  const current = controller;
  controller = undefined;
  if (current) {
    await current.stop();
    current.dispose();
  }
}
