#!/usr/bin/env bash
# Builds the allocsim wheel: the web site (build-web, the `web` profile) and the wheel with
# maturin, for manylinux_2_28 linked by zig (glibc 2.28: Ubuntu 22.04, RHEL 8 and newer;
# maturin's audit checks it), abi3 (one wheel for CPython 3.9+).
#
#   scripts/build-wheel.sh [OUT_DIR]     (default target/wheels; PROFILE=ci for CI's build)
#
# maturin and ziglang are installed from PyPI, pinned, into a tools venv in
# $CARGO_TARGET_DIR/py-tools (python3 -m venv; PYTHON picks another interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$(pwd)/target}"
out=$(realpath -m "${1:-$CARGO_TARGET_DIR/wheels}")
profile="${PROFILE:-release}"
python="${PYTHON:-python3}"
tools="$CARGO_TARGET_DIR/py-tools"
site="$CARGO_TARGET_DIR/allocsim-site"
if [ ! -x "$tools/bin/maturin" ] || [ ! -x "$tools/bin/python" ]; then
  rm -rf "$tools"
  "$python" -m venv "$tools"
  "$tools/bin/pip" install -q --disable-pip-version-check maturin==1.16.0 ziglang==0.17.1
fi
rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown ||
  rustup target add wasm32-unknown-unknown >/dev/null 2>&1
cargo build --quiet --profile "$profile" -p allocsim-web --bin build-web
"$CARGO_TARGET_DIR/$profile/build-web" --out "$site" >/dev/null
mkdir -p "$out"
rm -f "$out"/allocsim-*.whl
(cd python && PATH="$tools/bin:$PATH" ALLOCSIM_SITE_DIR="$site" \
  maturin build --quiet --profile "$profile" --zig --compatibility manylinux_2_28 --auditwheel check -i "$tools/bin/python" -o "$out")
ls "$out"/allocsim-*.whl
