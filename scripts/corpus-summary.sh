#!/usr/bin/env bash
# The last line of the test run: which real traces the tests checked. A clone without the
# shared corpus beside it checks only the repository's own (tests/traces) and says so out
# loud. Usage: corpus-summary.sh [SHARED_TRACES_DIR] (default ../shared/traces).
set -euo pipefail
cd "$(dirname "$0")/.."
shared="${1:-../shared/traces}"
repo=$(find tests/traces -name '*.pickle.gz' | wc -l)
if [ -d "$shared" ]; then
  n=$(find "$shared" -maxdepth 2 -name '*.pickle.gz' | wc -l)
  echo "real traces checked: $repo of the repository and $n of $shared"
else
  echo "WARNING: $shared is missing: only the repository's $repo real traces were checked; the shared corpus tests printed 'skipped'"
fi
