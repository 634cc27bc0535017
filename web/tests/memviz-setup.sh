#!/usr/bin/env bash
# Sets up PyTorch's memory_viz as a comparator for web/tests/bench-memviz.mjs, in the
# git-ignored folder web/tests/memviz/. Its code is never committed here: this script only
# says where it comes from, checks it, and fetches d3 from npm.
#
# MemoryViz.js: pytorch/pytorch, torch/utils/viz/MemoryViz.js at commit
# 00067369c9339bed950762afec327514d6fa2566 (the version ../shared/docs/pytorch-allocator.md
# cites), 46,791 bytes, sha256 below (git blob b110d213dacf8b6758744384e18698ea9bf3c53b).
#
#   web/tests/memviz-setup.sh [PATH/TO/MemoryViz.js]
#
# With a path, copies that file in (after checking it); without one, downloads it from
# raw.githubusercontent.com at that commit if web/tests/memviz/MemoryViz.js is not there
# yet. The file imports d3 v5 from cdn.skypack.dev (d3@5, d3-axis@1, d3-scale@1, d3-zoom@1,
# d3-brush@1); the same versions skypack resolves those to are installed from npm into
# web/tests/memviz/node_modules, and bench-memviz.mjs's server maps the CDN addresses to
# them with an import map (no request leaves the machine while it runs).
set -euo pipefail
cd "$(dirname "$0")"
dir=memviz
commit=00067369c9339bed950762afec327514d6fa2566
size=46791
sha=04654ea8f89d3cdfeb6a8d8132ff040acb5d1dabcab15de12d85957a34a7a7dc
url="https://raw.githubusercontent.com/pytorch/pytorch/$commit/torch/utils/viz/MemoryViz.js"
mkdir -p "$dir"

check() {
  local got_size got_sha
  got_size=$(wc -c <"$1")
  got_sha=$(sha256sum "$1" | cut -d' ' -f1)
  if [ "$got_size" != "$size" ] || [ "$got_sha" != "$sha" ]; then
    echo "$1: $got_size bytes, sha256 $got_sha; expected $size bytes, sha256 $sha (MemoryViz.js at pytorch/pytorch@$commit)" >&2
    return 1
  fi
}

if [ $# -ge 1 ]; then
  check "$1"
  cp "$1" "$dir/MemoryViz.js"
elif [ ! -f "$dir/MemoryViz.js" ]; then
  echo "downloading $url"
  curl -fsSL --max-time 60 -o "$dir/MemoryViz.js.part" "$url"
  check "$dir/MemoryViz.js.part"
  mv "$dir/MemoryViz.js.part" "$dir/MemoryViz.js"
fi
check "$dir/MemoryViz.js"

# What https://cdn.skypack.dev/d3@5 etc. resolve to: the newest release of each major.
# Its own package.json, so that npm installs there and not in web/tests.
if [ ! -f "$dir/node_modules/d3/package.json" ]; then
  [ -f "$dir/package.json" ] || echo '{"private": true}' >"$dir/package.json"
  (cd "$dir" && npm install --no-audit --no-fund --loglevel=error --no-save \
    d3@5.16.0 d3-axis@1.0.12 d3-scale@1.0.7 d3-zoom@1.8.3 d3-brush@1.1.6 >/dev/null)
fi
echo "memory_viz ready in web/tests/$dir (MemoryViz.js @ ${commit:0:8}, d3 $(node -p "require('./$dir/node_modules/d3/package.json').version"))"
