#!/usr/bin/env bash
# Installs what tests/e2e/test_vscode.py needs on a Debian machine, and nothing it already has:
#   1. Debian packages: chromium (the browser Playwright drives), and libkrb5-dev, pkg-config, ripgrep, a C/C++
#      toolchain (code-server's native modules are built from source);
#   2. code-server 4.100.3 (= VS Code 1.100.3, the last release that runs on Node 20), from the npm registry only,
#      into .cache/editors/code-server-4.100.3 (`npm install -g code-server` does not work: its nested npm install
#      fails under npm 11, and @vscode/ripgrep's postinstall downloads rg from GitHub);
#   3. this extension's npm packages (TypeScript, vsce, playwright-core; no browser download).
#
# Usage: bash editors/vscode/scripts/setup-e2e.sh        (root, or a user with sudo for apt-get)
# Then:  DIFFGEMMA_REQUIRE_VSCODE=1 .venv/bin/python -m pytest -q tests/e2e/test_vscode.py
# Env:   CODE_SERVER_DIR (default: <repo>/.cache/editors/code-server-4.100.3; the test reads DIFFGEMMA_CODE_SERVER).
set -euo pipefail

EXT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROOT=$(cd "$EXT/../.." && pwd)
VER=4.100.3
DEST=${CODE_SERVER_DIR:-$ROOT/.cache/editors/code-server-$VER}
MARKER=$DEST/.diffgemma-setup-complete
say() { printf 'setup-e2e: %s\n' "$*" >&2; }

# -- 1. Debian packages -------------------------------------------------------------------------------------------
missing=()
for pkg in chromium libkrb5-dev pkg-config ripgrep make g++ python3; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  sudo=()
  [[ $(id -u) -eq 0 ]] || sudo=(sudo)
  say "apt-get install ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
  say "Debian packages present"
fi

# -- Node 20+ (code-server 4.100.3 wants node 20; Debian bookworm's nodejs is 18) ----------------------------------
command -v node >/dev/null && command -v npm >/dev/null || { say "node and npm (Node 20) are required"; exit 1; }
node_major=$(node -p 'process.versions.node.split(".")[0]')
((node_major >= 20)) || { say "Node 20+ is required, found $(node --version)"; exit 1; }
# Node's headers, so node-gyp never downloads them (nodesource ships them in /usr/include/node).
[[ -f /usr/include/node/node.h ]] && export npm_config_nodedir=/usr
npm_q=(--no-audit --no-fund --loglevel=error)

# -- 2. code-server -------------------------------------------------------------------------------------------------
if [[ -f $MARKER && $(cat "$MARKER") == "$VER" && -f $DEST/out/node/entry.js ]]; then
  say "code-server $VER present in $DEST"
else
  say "building code-server $VER into $DEST (about 1-2 minutes)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && npm pack -q "code-server@$VER" >/dev/null && tar -xzf "code-server-$VER.tgz")
  build=$work/package
  (
    cd "$build"
    npm install --omit=dev --ignore-scripts "${npm_q[@]}"
    npm rebuild argon2 "${npm_q[@]}" # built from source (its prebuilt download fails and it falls back)
    cd lib/vscode
    npm install --omit=dev --ignore-scripts "${npm_q[@]}"
    npm rebuild kerberos @parcel/watcher @vscode/deviceid @vscode/spdlog native-watchdog "${npm_q[@]}"
    # node-pty's last install step runs `npx node-gyp` for compile_commands.json only; it fails after pty.node is built.
    npm rebuild node-pty "${npm_q[@]}" >"$work/node-pty.log" 2>&1 ||
      test -f node_modules/node-pty/build/Release/pty.node || { cat "$work/node-pty.log" >&2; exit 1; }
    mkdir -p node_modules/@vscode/ripgrep/bin && ln -sf "$(command -v rg)" node_modules/@vscode/ripgrep/bin/rg
    ln -sfn node_modules node_modules.asar # what code-server's postinstall.sh does
    (cd bin/remote-cli && ln -sf code-linux.sh code-server)
    (cd bin/helpers && ln -sf browser-linux.sh browser.sh)
    (cd extensions && npm install --omit=dev "${npm_q[@]}")
  )
  # Without its own config dir the CLI writes ~/.config/code-server/config.yaml.
  cfg=$(mktemp -d)
  XDG_CONFIG_HOME=$cfg node "$build/out/node/entry.js" --version >/dev/null
  rm -rf "$cfg"
  mkdir -p "$(dirname "$DEST")"
  rm -rf "$DEST"
  mv "$build" "$DEST"
  echo "$VER" >"$MARKER"
  say "code-server $VER ready"
fi

# -- 3. the extension's npm packages (playwright-core drives Debian's chromium: no browser download) ----------------
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
if [[ ! -d $EXT/node_modules || $EXT/package-lock.json -nt $EXT/node_modules ]]; then
  say "npm ci in $EXT"
  (cd "$EXT" && npm ci "${npm_q[@]}" && touch node_modules)
else
  say "npm packages present in $EXT"
fi
say "done"
