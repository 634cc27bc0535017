#!/bin/bash
# The GPU validation run (issue 5): the CUDA tests, then cuda-replay of every shared trace
# in model mode (with its cap), with a balloon at the trace caps, and in raw mode; results
# and native-backend/gpu/summarize.py's table under $OUT. Run from the repo root on the
# GPU machine, with a git-ignored .carry/ holding (built here, x86-64, stripped):
#   .carry/bin/allocsim        cargo build --release -p allocsim-app --no-default-features --features cuda
#   .carry/bin/cuda_tests, fake_gpu_tests, unit_tests
#                              cargo test --release -p allocsim-native --no-run
#   .carry/bin/cli_tests       cargo test --release -p allocsim-app --no-default-features --features cuda --test cuda_replay_cli --no-run
#   .carry/bin/live_cuda_tests, app_unit_tests
#                              cargo test --release -p allocsim-app --test live_cuda --lib --no-run
#                              (the desktop app's live CUDA replay: its thread's path on the
#                              GPU, and the panel's UI tests on recorded message streams)
#   .carry/traces/             a copy of ../shared/traces
#   .carry/summarize.py        a copy of native-backend/gpu/summarize.py
set -u
C=$PWD/.carry; R=/tmp/res; rm -rf $R; mkdir -p $R/model $R/balloon $R/raw $R/timeline
START=$(date +%s); LIMIT=${LIMIT:-520}
left() { [ $(( $(date +%s) - START )) -lt $LIMIT ]; }
{
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
ldconfig -p | grep -m2 libcuda
echo "== tests"; date
$C/bin/cuda_tests --test-threads=1 --nocapture > $R/cuda_tests.txt 2>&1; echo "cuda tests rc=$?"; grep -E "^test |test result|skipped" $R/cuda_tests.txt
$C/bin/fake_gpu_tests > $R/fake_tests.txt 2>&1; echo "fake tests rc=$?"; grep "test result" $R/fake_tests.txt
$C/bin/unit_tests > $R/unit_tests.txt 2>&1; echo "unit tests rc=$?"; grep "test result" $R/unit_tests.txt
ALLOCSIM_BIN=$C/bin/allocsim ALLOCSIM_TRACES=$C/traces $C/bin/cli_tests --test-threads=1 --nocapture > $R/cli_tests.txt 2>&1; echo "cli tests rc=$?"; grep -E "^test |test result|skipped" $R/cli_tests.txt
if [ -x $C/bin/live_cuda_tests ]; then
  $C/bin/live_cuda_tests --test-threads=1 --nocapture > $R/live_cuda_tests.txt 2>&1; echo "live cuda tests rc=$?"; grep -E "^test |test result|skipped" $R/live_cuda_tests.txt
  $C/bin/app_unit_tests live_tests --test-threads=1 > $R/app_live_tests.txt 2>&1; echo "app live panel tests rc=$?"; grep -E "^test |test result" $R/app_live_tests.txt
fi
cap_of() { python3 -c "import json,sys; c=json.load(open('$C/traces/$1.stats.json')).get('memory_fraction_cap_gib'); print(round(c*2**30) if c else '')"; }
run() { # kind name timeout args...
  local kind=$1 n=$2 t=$3; shift 3
  left || { echo "$kind $n skipped: out of time"; return; }
  local s=$(date +%s.%N)
  timeout $t $C/bin/allocsim cuda-replay "$@" --json > $R/$kind/$n.json 2> $R/$kind/$n.err
  echo "$kind $n rc=$? $(python3 -c "print(f'{$(date +%s.%N)-$s:.1f}s')")"
}
echo "== model mode"; date
for f in $C/traces/*.pickle.gz $C/traces/*.json; do
  case $f in *.stats.json) continue;; esac
  n=$(basename $f); n=${n%%.*}; cap=$(cap_of $n)
  if [ -n "$cap" ]; then run model $n 100 $f --verify-data --capacity $cap; else run model $n 100 $f --verify-data; fi
done
run model two_gpu_pipeline_dev1 60 $C/traces/two_gpu_pipeline.pickle.gz --verify-data --trace-device 1
echo "== balloon"; date
for f in $C/traces/*.pickle.gz; do
  n=$(basename $f); n=${n%%.*}; cap=$(cap_of $n)
  [ -n "$cap" ] && run balloon $n 100 $f --balloon $cap --timeline $R/timeline/$n.balloon.csv
done
echo "== raw"; date
for f in $C/traces/*.pickle.gz; do
  n=$(basename $f); n=${n%%.*}
  run raw $n 100 $f --mode raw --verify-data --timeline $R/timeline/$n.raw.csv
done
run raw oom_story_pytorch 60 $C/traces/oom_story.pickle.gz --mode raw --allocator pytorch
date
python3 $C/summarize.py $R > $R/summary.txt 2>&1; cat $R/summary.txt
} 2>&1 | tee $R/log.txt
cd /tmp && tar czf $OUT/results.tar.gz res && cp $R/summary.txt $R/log.txt $OUT/ 2>/dev/null
ls -la $OUT
