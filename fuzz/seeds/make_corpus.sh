#!/bin/sh
# Copies the seeds into the (uncommitted) working corpus.
cd "$(dirname "$0")/.." && mkdir -p corpus/decode_snapshot && cp seeds/*.pickle seeds/*.json seeds/*.gz corpus/decode_snapshot/
