#!/usr/bin/env bash
# The whole test suite of allocsim (the README's test command; .ci/run calls it).
# Installs what it needs itself. Needs ../shared/traces beside the checkout for the corpus
# tests (they print `skipped: <reason>` without it).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/tmp/allocsim-target}"
export CARGO_TERM_COLOR=never

step() { printf '\n==== %s\n' "$*"; }

step "format"
cargo fmt --all -- --check

step "clippy (pedantic, warnings are errors)"
cargo clippy --workspace --all-targets --profile ci -- -D warnings

step "without CUDA: native-backend and the CLI build, lint and test without the cuda feature"
cargo clippy -p allocsim-native --all-targets --profile ci --no-default-features -- -D warnings
cargo clippy -p allocsim-app --lib --bins --profile ci --no-default-features --features cli -- -D warnings
cargo test -p allocsim-native --profile ci --no-default-features
cargo test -p allocsim-app --profile ci --no-default-features --features cli --test cuda_replay_cli

step "unit, property, corpus and CLI tests (optimized, debug assertions on)"
cargo test --workspace --profile ci

if [ -x scripts/test-extra.sh ]; then
  step "extra suites"
  scripts/test-extra.sh
fi
step "fuzzing the snapshot decoder and trace builder (bounded)"
bash scripts/fuzz-ci.sh
step "browser"; bash scripts/test-browser.sh
step "python: the wheel in a fresh venv, pytest, the served viewer"; bash scripts/test-python.sh
step "done — $(bash scripts/corpus-summary.sh)"
