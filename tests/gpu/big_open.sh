#!/usr/bin/env bash
# On the GPU machine (its 16 cores, quiet): the generated > 1 GB snapshot of issue 17,
# measured natively where the CPU is not shared.
#
# The 1.12 GB file cannot travel (the carry holds 64 MiB), so it is generated there, as on
# the dev machine, by the carried `gen_snapshot` from big_gpt_long_stacks_s9:
#   gen_snapshot FROM /tmp/big.pickle --bytes 1.47GB --max-entries 14500000
# (1,124,391,974 bytes; the same file, byte for byte: the generator is deterministic — the
# script prints its sha256 to compare). Then, each under /usr/bin/time -v (wall, max RSS):
#   - `allocsim replay --json` (decode, trace build and validation, PyTorch replay);
#   - the app's open path, headless (`open` bench): recorded frame, first full frame, every
#     configuration replayed, peak RSS;
#   - CPython's `pickle.loads` of the file (the reference), when a python is there.
#   - the `first_frame` bench (`first-frame-bench`, when carried): the recorded frame, the
#     first full frame (main configuration) and every configuration, 3 runs, peak RSS.
# Needs in .carry/: allocsim, gen_snapshot, open-bench, big_gpt_long_stacks_s9.pickle.gz
# (and optionally bench_stages, first-frame-bench; allocsim-main, open-bench-main and
# first-frame-bench-main, main's builds, are then run alternated with the branch's, and
# the two `replay --json` outputs compared byte for byte). Binaries built on the dev
# machine, stripped (the carry holds 64 MiB: allocsim as `--no-default-features
# --features cli`; the benches' binaries from `cargo bench -p allocsim-app --bench open
# --bench first_frame --no-run`, under target/release/deps/).
# Prints one summary line per measurement; with $OUT set, writes summary.txt there too.
set -uo pipefail
cd "$(dirname "$0")/../.."
carry=.carry
for f in allocsim gen_snapshot open-bench big_gpt_long_stacks_s9.pickle.gz; do
  [ -e "$carry/$f" ] || { echo "skipped: $carry/$f missing"; exit 0; }
done
big="${BIG:-/tmp/big.pickle}"
summary="${OUT:-/tmp}/summary.txt"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
measure() {
  local what=$1; shift
  log=$(mktemp)
  /usr/bin/time -v "$@" > "$log.out" 2> "$log"; local rc=$?
  say "$what: rc=$rc wall=$(grep 'Elapsed (wall clock)' "$log" | awk '{print $NF}') max_rss_kb=$(grep 'Maximum resident set size' "$log" | awk '{print $NF}') user_s=$(grep 'User time' "$log" | awk '{print $NF}') sys_s=$(grep 'System time' "$log" | awk '{print $NF}')"
  tail -c 1500 "$log.out" | sed 's/^/    /' | tee -a "$summary"
}
[ -f "$big" ] || "$carry/gen_snapshot" "$carry/big_gpt_long_stacks_s9.pickle.gz" "$big" --bytes 1.47GB --max-entries 14500000 | tail -2
say "file: $(stat -c %s "$big") bytes, sha256 $(sha256sum "$big" | cut -c1-16); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
# Optional: the stages of `allocsim replay`, one thread (bench_stages: wall and on-CPU).
[ -x "$carry/bench_stages" ] && measure "stages (one thread)" "$carry/bench_stages" "$big"
# Main's builds where carried, alternated with the branch's.
sides=("")
[ -x "$carry/allocsim-main" ] && sides=("-main" "")
for i in 1 2; do
  for side in "${sides[@]}"; do
    measure "allocsim$side replay (run $i)" "$carry/allocsim$side" replay --json "$big"
    cp "$log.out" "/tmp/replay$side.json" 2>/dev/null
    [ -x "$carry/open-bench$side" ] && measure "app open path$side (run $i)" "$carry/open-bench$side" "$big"
  done
done
if [ -x "$carry/allocsim-main" ]; then
  cmp -s /tmp/replay-main.json /tmp/replay.json && say "replay --json: main's and the branch's identical" || say "replay --json: main's and the branch's DIFFER"
fi
for side in "${sides[@]}"; do
  [ -x "$carry/first-frame-bench$side" ] && measure "first_frame bench$side (3 runs)" "$carry/first-frame-bench$side" "$big" --runs 3
done
for p in python3.12 python3; do
  if "$p" -c 1 >/dev/null 2>&1; then
    measure "pickle.loads" "$p" -c "import pickle,sys,time; b=open(sys.argv[1],'rb').read(); t=time.perf_counter(); pickle.loads(b); print('loads_s', round(time.perf_counter()-t,3))" "$big"
    break
  fi
done
exit 0
