#!/usr/bin/env bash
# Retrieval benchmark for bench/README.md: answer recall@1/3/5 and search
# latency of the `tantivy` (BM25), `dense` and `hybrid` backends on the
# default index, side by side in one run, through `seeker eval --retrieval-only`
# (the dispatcher a rollout searches through; its result cache never hits
# because every question is searched once per backend and client count).
#
# Questions: the first LIMIT (default 300) FanOutQA dev sub-questions with a
# gold answer that occurs somewhere in the corpus (`--answer-in`), the question
# as the query. With QUERIES=FILE (an earlier `seeker eval --out FILE` run on
# the same questions) a second table scores the queries the model wrote there.
# Latency: per search round, with 1 and 16 rounds in flight (CLIENTS); at the
# highest client count `dense` also runs with query batching off
# (search.dense.batch_size = 1: each query its own forward pass), the
# before/after of the query encoder's batching.
#
# Needs data/ and the dense index: `scripts/fetch-defaults.sh --dense` (it
# prints the dense build's time; `/usr/bin/time -v` around it gives the RSS).
# SEEKER_BIN picks the binary (default: `cargo build --release`).
# Output: the eval reports on stdout, per-question JSONL in target/bench-retrieval/.
#
# usage: bench/retrieval.sh       LIMIT=100 CLIENTS="1" bench/retrieval.sh
set -euo pipefail
cd "$(dirname "$0")/.."

LIMIT=${LIMIT:-300}
CLIENTS=${CLIENTS:-"1 16"}
BACKENDS=${BACKENDS:-"tantivy dense hybrid"}
OUT=target/bench-retrieval
mkdir -p "$OUT"
if [[ -z ${SEEKER_BIN:-} ]]; then
    cargo build --release --quiet
    SEEKER_BIN=target/release/seeker
fi
[[ -f data/wiki/index/dense/seeker-dense.json ]] || {
    echo "bench/retrieval.sh: no dense index; run scripts/fetch-defaults.sh --dense" >&2
    exit 1
}

run() { # backend clients [extra args...]
    local backend=$1 clients=$2
    shift 2
    echo "## $backend, $clients clients $*"
    "$SEEKER_BIN" eval --retrieval-only --dataset data/fanoutqa/dev.json \
        --fanoutqa-subquestions --answer-in data/wiki/corpus.jsonl --limit "$LIMIT" \
        --backend "$backend" --top-k 5 --concurrency "$clients" \
        --out "$OUT/$backend-$clients.jsonl" "$@"
    echo
}

for clients in $CLIENTS; do
    for backend in $BACKENDS; do
        run "$backend" "$clients"
    done
done
most=$(tr ' ' '\n' <<<"$CLIENTS" | sort -n | tail -1)
if [[ $most -gt 1 && " $BACKENDS " == *" dense "* ]]; then
    echo "## query batching off (search.dense.batch_size = 1)"
    SEEKER_SEARCH__DENSE__BATCH_SIZE=1 run dense "$most"
fi
if [[ -n ${QUERIES:-} ]]; then
    for backend in $BACKENDS; do
        run "$backend" 1 --queries-from "$QUERIES"
    done
fi
