#!/usr/bin/env bash
# Long fuzzing on the GPU machine's 16 cores (issue 19): both targets with -fork=16 for
# ALLOCSIM_FUZZ_SECONDS each (default 260: both within ~9 minutes; ALLOCSIM_FUZZ_TARGETS picks
# them). Builds nothing: the
# fuzz binaries are built here with
#   cd fuzz && CARGO_TARGET_DIR=/tmp/allocsim-fuzz-target cargo +nightly fuzz build
#   mkdir -p ../.carry/fuzz && cp /tmp/allocsim-fuzz-target/x86_64-unknown-linux-gnu/release/{decode_snapshot,structured_snapshot} ../.carry/fuzz/
#   strip --strip-debug ../.carry/fuzz/*    # 38 MB → 11 MB each (symbols kept): the carry limit is 64 MiB
# and carried in .carry/fuzz/. Writes each target's log, final stats and any crashing
# input to $OUT/<target>/; exits non-zero if either target found a crash.
set -uo pipefail
cd "$(dirname "$0")/.."
secs="${ALLOCSIM_FUZZ_SECONDS:-260}"
out="${OUT:-/tmp/allocsim-fuzz-out}"
bins=.carry/fuzz
status=0
for target in ${ALLOCSIM_FUZZ_TARGETS:-decode_snapshot structured_snapshot}; do
  dir="$out/$target"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  extra=(-max_len=4096)
  if [ "$target" = decode_snapshot ]; then
    cp fuzz/seeds/*.pickle fuzz/seeds/*.json fuzz/seeds/*.gz "$dir/corpus"/
    extra=(-dict=fuzz/seeds/pickle.dict -max_len=65536)
  fi
  start=$(date +%s)
  "$bins/$target" "$dir/corpus" "${extra[@]}" -fork=16 -ignore_crashes=0 \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/" >"$dir/fuzz.log" 2>&1 || status=1
  end=$(date +%s)
  {
    echo "target $target: $((end - start)) s wall on $(nproc) cores, -fork=16"
    grep -E '#[0-9]+: cov: .* exec/s' "$dir/fuzz.log" | tail -n 1
    grep -E '^(Done|stat::)|INFO: fuzzed for' "$dir/fuzz.log" | tail -n 5
    echo "crashes: $(find "$dir/artifacts" -type f | wc -l)"
  } | tee "$dir/summary.txt"
  # The corpus can be large; keep only its size.
  echo "corpus files: $(find "$dir/corpus" -type f | wc -l)" >>"$dir/summary.txt"
  rm -rf "$dir/corpus"
done
exit $status
