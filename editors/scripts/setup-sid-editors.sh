#!/bin/bash
# Neovim 0.12 and Helix 25.07 for the end-to-end tests, on a Debian bookworm machine whose own packages are too
# old (bookworm: nvim 0.7, no hx). Downloads both with their dependency closure from Debian sid through a private
# apt configuration (the system's apt state is untouched), unpacks the .debs into DIR/sidroot without installing
# anything, and writes DIR/nvim012 and DIR/hx-sid, wrappers that start them with sid's own glibc loader.
# Idempotent: does nothing when both wrappers already run.   usage: setup-sid-editors.sh DIR
set -euo pipefail
BASE=$(mkdir -p "${1:?usage: setup-sid-editors.sh DIR}" && cd "$1" && pwd)
if "$BASE/nvim012" --version >/dev/null 2>&1 && "$BASE/hx-sid" --version >/dev/null 2>&1; then
  "$BASE/nvim012" --version | head -1; "$BASE/hx-sid" --version; exit 0
fi
ROOT=$BASE/sidroot
APT=$BASE/apt-sid
mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/debs"
# The Debian mirror this machine already uses, with sid instead of its own suite.
MIRROR=$(grep -h "^URIs:.*debian$" /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 | awk '{print $2}')
MIRROR=${MIRROR:-$(grep -ho "https\?://[^ ]*debian" /etc/apt/sources.list 2>/dev/null | head -1)}
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR sid main" > "$APT/sources.list"
OPTS=(-o "Dir::Etc::sourcelist=$APT/sources.list" -o Dir::Etc::sourceparts=- -o "Dir::State::Lists=$APT/lists"
      -o "Dir::Cache=$APT/cache" -o Dir::State::status=/dev/null -o Debug::NoLocking=1)
apt-get "${OPTS[@]}" update -qq
# Dir::State::status=/dev/null: resolve as if nothing were installed, so the closure is complete.
packages=$(apt-cache "${OPTS[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
             --no-replaces --no-enhances neovim hx | grep -v '^ ' | grep -v '^<' | sort -u)
(cd "$APT/debs" && rm -f ./*.deb && apt-get "${OPTS[@]}" download $packages 2>&1 | grep -v unsandboxed || true)
rm -rf "$ROOT" && mkdir -p "$ROOT"
for deb in "$APT"/debs/*.deb; do dpkg-deb -x "$deb" "$ROOT"; done
LIB=$ROOT/usr/lib/x86_64-linux-gnu
cat > "$BASE/nvim012" <<WRAPPER
#!/bin/sh
# Neovim from Debian sid, started with sid's glibc loader (nothing installed system-wide).
export VIM=$ROOT/usr/share/nvim VIMRUNTIME=$ROOT/usr/share/nvim/runtime
exec $LIB/ld-linux-x86-64.so.2 --library-path $LIB $ROOT/usr/bin/nvim "\$@"
WRAPPER
cat > "$BASE/hx-sid" <<WRAPPER
#!/bin/sh
# Helix from Debian sid, started with sid's glibc loader (Helix finds its runtime through HELIX_RUNTIME).
export HELIX_RUNTIME=\${HELIX_RUNTIME:-$ROOT/usr/lib/hx/runtime}
exec $LIB/ld-linux-x86-64.so.2 --library-path $LIB $ROOT/usr/bin/hx "\$@"
WRAPPER
chmod +x "$BASE/nvim012" "$BASE/hx-sid"
"$BASE/nvim012" --version | head -1
"$BASE/hx-sid" --version
