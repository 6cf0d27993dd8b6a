#!/usr/bin/env bash
# Dense search at scale for bench/README.md: seeker's exact search against its sign-bit
# search with exact rescoring (what an index past search.dense.approximate_above serves)
# and an HNSW graph (hnsw_rs), on N synthetic vectors (default 1,000,000) made from the
# default index's MiniLM vectors, with 200 real FanOutQA queries (examples/dense_bench.rs).
# Prints JSON lines: build seconds and RSS, p50/p99 per query, recall@10 against exact
# for each rescore depth and each ef.
#
# Release build: the sign-bit scan is seeker's own code, which the dev profile does not
# optimise (PROFILE=dev for the test build). Needs data/wiki/index/dense:
# scripts/fetch-defaults.sh --dense.
#
# DATA: copies (default: noisy copies of the real vectors) or gaussian (draws with the
#   real vectors' mean and covariance; no near-duplicates).
# SIGMA: the noise per coordinate of copies (default 0.05: a copy's cosine with its source ~0.7).
# INDEX: binary,hnsw (default) or one of them; the graph takes 15-40 minutes to build at 1M.
# RESCORE: the sign-bit search's candidates rescored exactly (default 1000,2000,4000,8000,16000).
# M, EFC, EF: the graph's m (default 16), ef_construction (default 100) and search ef's.
# usage: bench/dense.sh      INDEX=binary DATA=gaussian bench/dense.sh
#        N=100000 EF=64,128 SIGMA=0.02 bench/dense.sh      DATA=gaussian M=32 EFC=200 bench/dense.sh
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-1000000}
EF=${EF:-32,64,128,256,512}
RESCORE=${RESCORE:-1000,2000,4000,8000,16000}
INDEX=${INDEX:-binary,hnsw}
SIGMA=${SIGMA:-0.05}
DATA=${DATA:-copies}
M=${M:-16}
EFC=${EFC:-100}
PROFILE=${PROFILE:-release}
[[ -f data/wiki/index/dense/vectors.f32 ]] || {
    echo "bench/dense.sh: no dense index; run scripts/fetch-defaults.sh --dense" >&2
    exit 1
}
cargo build --quiet --profile "$PROFILE" --example dense_bench
dir=debug
[[ $PROFILE == dev ]] || dir=$PROFILE
/usr/bin/time -f "peak RSS %M KB, %e s wall" "target/$dir/examples/dense_bench" --n "$N" --ef "$EF" \
    --rescore "$RESCORE" --index "$INDEX" --sigma "$SIGMA" --data "$DATA" --m "$M" --ef-construction "$EFC"
