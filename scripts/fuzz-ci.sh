#!/usr/bin/env bash
# A bounded fuzz run of the snapshot decoder and trace builder (a step of scripts/test.sh):
# libFuzzer through cargo-fuzz on the two targets of fuzz/fuzz_targets/ —
# decode_snapshot (byte mutations of the committed seeds, ALLOCSIM_FUZZ_SECONDS, default
# 60 s) and structured_snapshot (snapshots generated from their schema: sizes near the
# limits, shared references, impossible segments; ALLOCSIM_FUZZ_STRUCTURED_SECONDS,
# default 30 s). Any crash, hang (over 10 s on one input) or input needing more than
# 2 GiB fails the step; libFuzzer keeps the input under fuzz/artifacts/<target>/.
# Installs the nightly toolchain and cargo-fuzz when missing.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${ALLOCSIM_FUZZ_SECONDS:-60}"
structured_secs="${ALLOCSIM_FUZZ_STRUCTURED_SECONDS:-30}"
export CARGO_TARGET_DIR="${ALLOCSIM_FUZZ_TARGET:-/tmp/allocsim-fuzz-target}"

rustup run nightly rustc --version >/dev/null 2>&1 ||
  rustup toolchain install nightly --profile minimal >/dev/null
command -v cargo-fuzz >/dev/null 2>&1 ||
  cargo install cargo-fuzz --locked --version 0.13.2 --quiet

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/decode" "$work/structured"
cp seeds/*.pickle seeds/*.json seeds/*.gz "$work/decode"/
# Inputs the structured target once failed on (regressions), run first.
cp seeds/structured/* "$work/structured"/
cargo +nightly fuzz build decode_snapshot
cargo +nightly fuzz build structured_snapshot

# run TARGET CORPUS SECONDS [libFuzzer flags…]
run() {
  local target=$1 corpus=$2 t=$3
  shift 3
  local log="$work/$target.log" status=0
  cargo +nightly fuzz run "$target" "$corpus" -- "$@" -max_total_time="$t" \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1 || status=$?
  if [ "$status" -ne 0 ]; then
    tail -n 60 "$log"
    echo "fuzzing $target failed (exit $status): the input is under fuzz/artifacts/$target/"
    exit 1
  fi
  echo "$target:"
  grep -E '^(Done [0-9]+ runs|stat::number_of_executed_units|stat::peak_rss_mb)' "$log" || tail -n 3 "$log"
}
run decode_snapshot "$work/decode" "$secs" -dict=seeds/pickle.dict -max_len=65536
run structured_snapshot "$work/structured" "$structured_secs" -max_len=4096
