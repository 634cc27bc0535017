#!/usr/bin/env bash
# The allocsim web app in a real browser (a step of scripts/test.sh, and CI).
#
# Builds the site (the `web` profile: optimized, LTO), checks the compressed wasm against
# the 6 MB bound, serves the folder locally, and drives Debian's headless Chromium with
# playwright-core (no browser download) through web/tests/browser.mjs: `?renderer=wgpu`
# drawing the example (glow is the default painter), the first-frame marker, a canvas that is not blank, a real snapshot dropped on it, arrow keys moving the
# shown event, `?trace=<url>`, no request leaving the local server, no frame frozen while a
# big trace loads, Diff and Ranks (the ranks in a pool of workers, the table equal to
# `allocsim ranks --json`), What would fit? cancelled by terminating its worker, no console
# error. Screenshots, the console and the figures are kept in
# $ALLOCSIM_ARTIFACTS (default /tmp/allocsim-artifacts).
#
# `scripts/test-browser.sh --bench [ARGS]` runs web/tests/bench.mjs instead (the README's
# browser figures: kvcache_decode opened to its first full frame, the layout at another
# event, the tab's memory; ARGS go to it: --trace, --runs, ...); `--bench-workers [ARGS]`
# runs web/tests/bench_workers.mjs (What would fit? against pickle.loads and the CLI's
# recommend, a set of ranks on 1 and 2 workers; ARGS go to it, e.g.
# `--extra /tmp/kvcache_1m.pickle --runs 2`).
# `scripts/test-browser.sh --memviz [ARGS]` runs web/tests/bench-memviz.mjs: ours and
# PyTorch's memory_viz alternately in the same browser (web/tests/memviz-setup.sh puts
# memory_viz in place; it says `skipped` without it); ARGS go to it (--trace, --runs, ...).
#
# Installs what it lacks, quietly, and skips what is there: Debian's chromium, nodejs and
# npm (apt-get), the wasm32 target (rustup), playwright-core (npm ci, pinned by
# web/tests/package-lock.json). Needs ../shared/traces beside the checkout (or
# ALLOCSIM_TRACES); prints `skipped: <reason>` without it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/tmp/allocsim-target}"
export CARGO_TERM_QUIET=true
traces="${ALLOCSIM_TRACES:-$root/../shared/traces}"
artifacts="${ALLOCSIM_ARTIFACTS:-/tmp/allocsim-artifacts}"
site="$CARGO_TARGET_DIR/allocsim-site"
mode=test
[ "${1:-}" = "--bench" ] && mode=bench
[ "${1:-}" = "--bench-workers" ] && mode=bench-workers
[ "${1:-}" = "--memviz" ] && mode=memviz
[ $# -gt 0 ] && shift

if [ ! -f "$traces/multistream_pub.pickle.gz" ] || [ ! -f "$traces/kvcache_decode.pickle.gz" ]; then
  echo "skipped: no real snapshots in $traces (set ALLOCSIM_TRACES)"
  exit 0
fi

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]} (apt-get)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown ||
  rustup target add wasm32-unknown-unknown >/dev/null 2>&1
if [ ! -f web/tests/node_modules/playwright-core/package.json ]; then
  (cd web/tests && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi

# The two small tools in the `ci` profile: scripts/test.sh's earlier steps built their
# dependencies there already.
t0=$(date +%s)
cargo build --profile ci -p allocsim-web --bins
# The CLI, whose answers the page's are compared with (built by scripts/test.sh's tests).
cargo build --profile ci -p allocsim-app --bin allocsim
"$CARGO_TARGET_DIR/ci/build-web" --out "$site"
echo "site built in $(($(date +%s) - t0)) s"

port_file=$(mktemp)
"$CARGO_TARGET_DIR/ci/serve-web" --dir "$site" --port 0 >"$port_file" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; rm -f "$port_file"' EXIT
url=
for _ in $(seq 1 100); do
  url=$(grep -o 'http://[^ ]*' "$port_file" | head -1 || true)
  [ -n "$url" ] && break
  sleep 0.1
done
[ -n "$url" ] || { echo "the local server did not start"; cat "$port_file"; exit 1; }

mkdir -p "$artifacts"
if [ "$mode" = bench-workers ]; then
  # ARGS first: an --allocsim among them (a release build) is taken over the ci one.
  node web/tests/bench_workers.mjs "$@" --url "$url" --traces "$traces" --out "$artifacts" \
    --chromium /usr/bin/chromium --allocsim "$CARGO_TARGET_DIR/ci/allocsim"
elif [ "$mode" = memviz ]; then
  node web/tests/bench-memviz.mjs --url "$url" --traces "$traces" --out "$artifacts/memviz" --chromium /usr/bin/chromium "$@"
elif [ "$mode" = bench ]; then
  node web/tests/bench.mjs --url "$url" --site "$site" --traces "$traces" --out "$artifacts" --chromium /usr/bin/chromium "$@"
else
  node web/tests/browser.mjs --url "$url" --site "$site" --traces "$traces" --out "$artifacts" --chromium /usr/bin/chromium \
    --allocsim "$CARGO_TARGET_DIR/ci/allocsim"
fi
