#!/usr/bin/env bash
# On the GPU machine: a real large recording (issue 17), measured where it was made.
#
# Records capture.py's `gpt_long_ring` (a GPT-style training run of 1,600 steps with Python
# stacks into PyTorch's 2 M-entry ring buffer, which wraps) into $BIG (default /tmp/big; the
# pickle is a few hundred MB to GBs and never leaves the machine), then measures on it, each
# under /usr/bin/time -v (wall seconds, max RSS):
#   - CPython's pickle.loads of the file (the reference every target is stated against);
#   - `allocsim validate --json`, `allocsim replay --json`, `allocsim recommend --json` (the
#     binary in .carry/allocsim, built on the dev machine);
#   - ALLOCSIM_OPEN_BENCH, when set to a command taking the snapshot path (the app's open
#     path, headless), the same way.
# Prints one summary line per measurement; with $OUT set, writes summary.txt and the
# recording's sidecar (stats.json) there.
set -uo pipefail
cd "$(dirname "$0")/../.."
big="${BIG:-/tmp/big}"
bin="${ALLOCSIM:-.carry/allocsim}"
mkdir -p "$big"
py=
for p in python3.12 python3; do
  if "$p" -c 'import torch' >/dev/null 2>&1; then py=$p; break; fi
done
[ -n "$py" ] || { echo "skipped: no python with torch"; exit 0; }
"$py" -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
  || { echo "skipped: no CUDA device"; exit 0; }
snap="$big/gpt_long_ring.pickle"
if [ ! -f "$snap" ]; then
  "$py" capture/capture.py all "$big" gpt_long_ring || exit 1
fi
summary="${OUT:-$big}/summary.txt"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
say "file: $(stat -c %s "$snap") bytes; $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
"$py" - "$snap" <<'PY' | tee -a "$summary"
import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
n = sum(len(t) for t in d["device_traces"])
frames = sum(len(e.get("frames") or []) for t in d["device_traces"] for e in t)
print(f"entries: {n} (device_traces), frames in entries: {frames}, segments: {len(d['segments'])}")
PY
measure() {
  local what=$1; shift
  local log
  log=$(mktemp)
  /usr/bin/time -v "$@" > "$log.out" 2> "$log" ; local rc=$?
  local wall rss
  wall=$(grep "Elapsed (wall clock)" "$log" | awk '{print $NF}')
  rss=$(grep "Maximum resident set size" "$log" | awk '{print $NF}')
  say "$what: rc=$rc wall=$wall max_rss_kb=$rss"
  head -c 600 "$log.out" | tr '\n' ' ' | sed 's/^/    /' | tee -a "$summary"; echo | tee -a "$summary"
}
for i in 1 2; do
  measure "pickle.loads (run $i)" "$py" -c "import pickle,sys,time; b=open(sys.argv[1],'rb').read(); t=time.perf_counter(); pickle.loads(b); print('loads_s', round(time.perf_counter()-t,3))" "$snap"
  measure "allocsim validate (run $i)" "$bin" validate --json "$snap"
  measure "allocsim replay (run $i)" "$bin" replay --json "$snap"
done
measure "allocsim recommend" "$bin" recommend --json "$snap"
if [ -n "${ALLOCSIM_OPEN_BENCH:-}" ]; then
  for i in 1 2; do measure "app open path (run $i)" $ALLOCSIM_OPEN_BENCH "$snap"; done
fi
[ -z "${OUT:-}" ] || cp "$big"/gpt_long_ring.stats.json "$OUT"/ 2>/dev/null
exit 0
