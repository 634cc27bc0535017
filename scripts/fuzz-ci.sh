#!/usr/bin/env bash
# A bounded fuzz run of the snapshot decoder and trace builder (a step of scripts/test.sh):
# libFuzzer through cargo-fuzz on fuzz/fuzz_targets/decode_snapshot.rs, starting from the
# committed seeds, for ALLOCSIM_FUZZ_SECONDS (default 60) seconds. Any crash, hang (over
# 10 s on one input) or input needing more than 2 GiB fails the step; libFuzzer keeps the
# input under fuzz/artifacts/. Installs the nightly toolchain and cargo-fuzz when missing.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${ALLOCSIM_FUZZ_SECONDS:-60}"
export CARGO_TARGET_DIR="${ALLOCSIM_FUZZ_TARGET:-/tmp/allocsim-fuzz-target}"

rustup run nightly rustc --version >/dev/null 2>&1 ||
  rustup toolchain install nightly --profile minimal >/dev/null
command -v cargo-fuzz >/dev/null 2>&1 ||
  cargo install cargo-fuzz --locked --version 0.13.2 --quiet

corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
cp seeds/*.pickle seeds/*.json seeds/*.gz "$corpus"/
cargo +nightly fuzz build decode_snapshot
log="$corpus/fuzz.log"
status=0
cargo +nightly fuzz run decode_snapshot "$corpus" -- \
  -dict=seeds/pickle.dict -max_len=65536 -max_total_time="$secs" \
  -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1 || status=$?
if [ "$status" -ne 0 ]; then
  tail -n 60 "$log"
  echo "fuzzing failed (exit $status): the input is under fuzz/artifacts/decode_snapshot/"
  exit 1
fi
grep -E '^(Done [0-9]+ runs|stat::number_of_executed_units|stat::peak_rss_mb)' "$log" || tail -n 3 "$log"
