#!/usr/bin/env bash
# json-diff.sh BIN_A BIN_B — byte-for-byte diff of every CLI answer that prints JSON.
#
# Runs `validate`, `replay`, `compare`, `min-capacity`, `recommend` and `explain` with
# `--json` on every shared trace (../shared/traces/*.pickle.gz and *.json, incoming/*) and
# on the repository's tests/traces/*, once with each binary, and compares stdout, stderr
# and the exit status. Capacity follows the before-stop hook's rule (../shared/hooks): a trace whose
# NAME.stats.json names `memory_fraction_cap_gib` runs with that cap
# (round(cap × 2^30) bytes), except in incoming/, which runs as recorded; min-capacity
# takes no capacity. Prints one line per difference and a summary; exits 1 on any
# difference, 2 on a usage error.
#
# Environment: TRACES (default ../shared/traces next to the repository), JSON_DIFF_TIMEOUT
# (seconds per command, default 300), JSON_DIFF_KEEP=DIR keeps every output there.
set -u
if [ $# -ne 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
  echo "usage: scripts/json-diff.sh BIN_A BIN_B  (two allocsim binaries)" >&2
  exit 2
fi
a=$(realpath "$1"); b=$(realpath "$2")
root=$(cd "$(dirname "$0")/.." && pwd)
traces=${TRACES:-$root/../shared/traces}
limit=${JSON_DIFF_TIMEOUT:-300}
out=${JSON_DIFF_KEEP:-$(mktemp -d)}
mkdir -p "$out"
[ -n "${JSON_DIFF_KEEP:-}" ] || trap 'rm -rf "$out"' EXIT

files=()
for f in "$traces"/*.pickle.gz "$traces"/*.json "$traces"/incoming/* "$root"/tests/traces/*; do
  [ -f "$f" ] || continue
  case "$f" in *.stats.json | *.md) continue ;; esac
  files+=("$f")
done
[ ${#files[@]} -gt 0 ] || { echo "no traces under $traces or $root/tests/traces" >&2; exit 2; }

# The cap of a trace, as `--capacity BYTES`, or nothing.
capacity() {
  local f=$1 dir name stats
  dir=$(dirname "$f"); name=$(basename "$f"); name=${name%%.*}
  stats=$dir/$name.stats.json
  case "$dir" in */incoming) return ;; esac
  [ -f "$stats" ] || return
  python3 -c "import json,sys
s=json.load(open(sys.argv[1])); c=s.get('memory_fraction_cap_gib')
print(f'--capacity {round(c*(1<<30))}' if c else '')" "$stats" 2>/dev/null
}

runs=0; same=0; diffs=()
for f in "${files[@]}"; do
  cap=$(capacity "$f")
  tag=$(basename "$(dirname "$f")")_$(basename "$f")
  for cmd in validate replay compare min-capacity recommend explain; do
    args=("$cmd" "$f" --json)
    [ "$cmd" = min-capacity ] || [ -z "$cap" ] || args+=($cap)
    for side in a b; do
      bin=$a; [ $side = b ] && bin=$b
      timeout "$limit" "$bin" "${args[@]}" >"$out/$tag.$cmd.$side.out" 2>"$out/$tag.$cmd.$side.err"
      echo "exit $?" >>"$out/$tag.$cmd.$side.err"
    done
    runs=$((runs + 1))
    if cmp -s "$out/$tag.$cmd.a.out" "$out/$tag.$cmd.b.out" &&
      cmp -s "$out/$tag.$cmd.a.err" "$out/$tag.$cmd.b.err"; then
      same=$((same + 1))
    else
      diffs+=("$tag $cmd")
      echo "DIFF: ${args[*]}" | sed "s|$root/||; s|$traces/|traces/|"
      diff <(head -c 2000 "$out/$tag.$cmd.a.out"; cat "$out/$tag.$cmd.a.err") \
        <(head -c 2000 "$out/$tag.$cmd.b.out"; cat "$out/$tag.$cmd.b.err") | head -8
    fi
  done
done
echo "json-diff: ${#files[@]} traces × 6 commands = $runs runs, $same identical, ${#diffs[@]} differ"
[ ${#diffs[@]} -eq 0 ]
