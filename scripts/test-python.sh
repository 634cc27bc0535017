#!/usr/bin/env bash
# The Python package (a step of scripts/test.sh, after the browser step).
#
# Builds the site (build-web) and the wheel with maturin (`--zig --compatibility
# manylinux_2_28`: maturin's audit checks the tag), installs the wheel into a fresh venv,
# runs pytest (python/tests: the API equals the CLI binary's JSON over the real traces, a
# snapshot as a dict, errors, `on_oom` against a fake torch, `allocsim serve`), then opens
# the page `allocsim serve FILE` serves in headless Chromium (web/tests/serve.mjs).
#
# Installs what it lacks: python3-venv (apt-get) when `python3 -m venv` cannot, and, in a
# tools venv kept in $CARGO_TARGET_DIR, pinned maturin, ziglang (zig for the manylinux
# link) and pytest from PyPI; Chromium, node and playwright-core as test-browser.sh does.
# Needs ../shared/traces beside the checkout (or ALLOCSIM_TRACES) for most tests.
# The wheel is left in $CARGO_TARGET_DIR/wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/tmp/allocsim-target}"
export CARGO_TERM_QUIET=true
traces="${ALLOCSIM_TRACES:-$root/../shared/traces}"
artifacts="${ALLOCSIM_ARTIFACTS:-/tmp/allocsim-artifacts}"
python="${PYTHON:-python3}"
site="$CARGO_TARGET_DIR/allocsim-site"
wheels="$CARGO_TARGET_DIR/wheels"
tools="$CARGO_TARGET_DIR/py-tools"
t0=$(date +%s)

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_install() {
  echo "installing $* (apt-get)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
new_venv() {
  "$python" -m venv "$1" 2>/dev/null || { apt_install python3-venv && rm -rf "$1" && "$python" -m venv "$1"; }
}

if [ ! -x "$tools/bin/maturin" ] || [ ! -x "$tools/bin/python" ]; then
  rm -rf "$tools"
  new_venv "$tools"
  "$tools/bin/pip" install -q --disable-pip-version-check maturin==1.16.0 ziglang==0.17.1
fi

# The site the wheel embeds (the browser step built it already: then this is quick).
cargo build --profile ci -p allocsim-web --bins
"$CARGO_TARGET_DIR/ci/build-web" --out "$site" >/dev/null
# The CLI binary the API is compared with.
cargo build --profile ci -p allocsim-app --bin allocsim

t1=$(date +%s)
rm -rf "$wheels"
(cd python && PATH="$tools/bin:$PATH" ALLOCSIM_SITE_DIR="$site" \
  maturin build --quiet --profile ci --zig --compatibility manylinux_2_28 --auditwheel check -i "$tools/bin/python" -o "$wheels")
wheel=$(ls "$wheels"/allocsim-*.whl)
echo "wheel built in $(($(date +%s) - t1)) s: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"

venv=$(mktemp -d)/venv
server=
trap 'rm -rf "$(dirname "$venv")"; [ -z "$server" ] || kill "$server" 2>/dev/null || true' EXIT
new_venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "$wheel" pytest==9.2.0
ALLOCSIM_BIN="$CARGO_TARGET_DIR/ci/allocsim" ALLOCSIM_TRACES="$traces" \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests

# The served viewer in headless Chromium.
if [ ! -f "$traces/oom_story.pickle.gz" ]; then
  echo "skipped: the served viewer (no real snapshots in $traces)"
else
  missing=()
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
  if [ ! -f web/tests/node_modules/playwright-core/package.json ]; then
    (cd web/tests && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  fi
  log="$(dirname "$venv")/serve.log"
  "$venv/bin/allocsim" serve "$traces/oom_story.pickle.gz" --port 0 >"$log" 2>&1 &
  server=$!
  url=
  for _ in $(seq 1 100); do
    url=$(grep -o 'http://[^ ]*' "$log" | head -1 || true)
    [ -n "$url" ] && break
    sleep 0.1
  done
  [ -n "$url" ] || { echo "allocsim serve did not start"; cat "$log"; exit 1; }
  mkdir -p "$artifacts"
  node web/tests/serve.mjs --url "$url" --name oom_story.pickle.gz --out "$artifacts" --chromium /usr/bin/chromium
fi
echo "python step: $(($(date +%s) - t0)) s"
