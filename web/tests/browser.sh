#!/usr/bin/env bash
# The allocsim web app in a real browser (CI): builds the site, serves it locally, drives
# Debian's headless Chromium with playwright-core (no browser download) through the test
# in browser.mjs, and keeps screenshots, the console and the timings as artifacts.
#
# Installs what it lacks: Debian's `chromium` (apt-get), the wasm32 target (rustup),
# playwright-core (npm, pinned in package.json / package-lock.json).
# Needs ../shared/traces beside the checkout (or ALLOCSIM_TRACES).
# Artifacts: $ARTIFACTS (default web/tests/artifacts).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
traces="${ALLOCSIM_TRACES:-$root/../shared/traces}"
artifacts="${ARTIFACTS:-$root/web/tests/artifacts}"
site="${SITE_DIR:-$CARGO_TARGET_DIR/allocsim-site}"

if [ ! -f "$traces/kvcache_decode.pickle.gz" ]; then
  echo "skipped: no real snapshots in $traces (set ALLOCSIM_TRACES)"
  exit 0
fi
if ! command -v chromium >/dev/null 2>&1; then
  echo "installing Debian's chromium"
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; fi
fi
command -v node >/dev/null 2>&1 || { echo "the browser test needs node and npm"; exit 2; }
rustup target list --installed 2>/dev/null | grep -q wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown
(cd web/tests && if [ -d node_modules/playwright-core ]; then :; else npm ci --no-audit --no-fund --silent; fi)

cargo run -q -p allocsim-web --bin build-web -- --out "$site"

port_file=$(mktemp)
cargo run -q -p allocsim-web --bin serve-web -- --dir "$site" --port 0 >"$port_file" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; rm -f "$port_file"' EXIT
for _ in $(seq 1 100); do
  grep -q "http://" "$port_file" 2>/dev/null && break
  sleep 0.1
done
url=$(grep -o 'http://[^ ]*' "$port_file" | head -1)
[ -n "$url" ] || { echo "the local server did not start"; cat "$port_file"; exit 1; }

rm -rf "$artifacts"
node web/tests/browser.mjs --url "$url" --traces "$traces" --out "$artifacts" --chromium "$(command -v chromium)"
