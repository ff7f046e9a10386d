/** Settings: which go to the server, and how the server is started. Pure functions, no `vscode` import. */

/** The configuration section; the server accepts its settings nested under it (`{"diffgemma": {...}}`) or flat. */
export const SECTION = 'diffgemma';

/** Settings this extension uses itself; they never reach the server (it would warn about unknown keys). */
export const EXTENSION_ONLY_KEYS: readonly string[] = ['serverPath', 'serverArgs'];

export const DEFAULT_SERVER_PATH = 'diffgemma-lsp';

/** The part of `vscode.WorkspaceConfiguration` used here. */
export interface ConfigReader {
  get<T>(key: string): T | undefined;
}

/** The part of an extension's package.json read here. */
export interface PackageJson {
  contributes?: { configuration?: { properties?: Record<string, unknown> } };
}

/** The server's setting names (camelCase, without `diffgemma.`), as contributed in package.json. */
export function serverSettingKeys(packageJson: PackageJson): string[] {
  const properties = packageJson.contributes?.configuration?.properties ?? {};
  return Object.keys(properties)
    .filter((name) => name.startsWith(`${SECTION}.`))
    .map((name) => name.slice(SECTION.length + 1))
    .filter((key) => !EXTENSION_ONLY_KEYS.includes(key));
}

/** The settings payload for the server (initializationOptions and didChangeConfiguration). */
export function serverSettings(config: ConfigReader, keys: readonly string[]): Record<string, unknown> {
  const settings: Record<string, unknown> = {};
  for (const key of keys) {
    const value = config.get<unknown>(key);
    if (value === undefined) {
      continue;
    }
    // The settings editor turns a cleared text box into "": for the model folder that means "the default".
    settings[key] = key === 'model' && value === '' ? null : value;
  }
  return settings;
}

/** `~` and `${workspaceFolder}` in a path or argument. */
export function expandVariables(value: string, home: string, workspaceFolder: string | undefined): string {
  let result = value;
  if (result === '~' || result.startsWith('~/')) {
    result = home + result.slice(1);
  }
  if (workspaceFolder !== undefined) {
    result = result.split('${workspaceFolder}').join(workspaceFolder);
  }
  return result;
}

export interface ServerCommand {
  command: string;
  args: string[];
}

/** The command line that starts the server (vscode-languageclient adds `--stdio`). */
export function serverCommand(config: ConfigReader, home: string, workspaceFolder?: string): ServerCommand {
  const path = config.get<string>('serverPath')?.trim() || DEFAULT_SERVER_PATH;
  const rawArgs = config.get<unknown>('serverArgs');
  const args = Array.isArray(rawArgs) ? rawArgs.filter((arg): arg is string => typeof arg === 'string') : [];
  return {
    command: expandVariables(path, home, workspaceFolder),
    args: args.map((arg) => expandVariables(arg, home, workspaceFolder)),
  };
}
