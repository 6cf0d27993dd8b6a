#!/usr/bin/env bash
# Search benchmarks for bench/README.md: dispatcher fan-out against a backend with
# 200 ms latency, and tantivy vs bm25s on the default corpus and on a synthetic
# corpus of N passages (default 1,000,000). Prints JSON lines; writes its data
# under target/search-bench (nothing is committed).
#
# usage: bench/search.sh            (needs data/ from scripts/fetch-defaults.sh)
#        N=200000 bench/search.sh   (a smaller synthetic corpus)
set -euo pipefail
cd "$(dirname "$0")/.."
N="${N:-1000000}"
OUT=target/search-bench
mkdir -p "$OUT"

python3 -m pip install -q bm25s==0.3.16 PyStemmer==3.1.0
cargo build --release --example search_bench
B=target/release/examples/search_bench

python3 bench/make_search_data.py queries data/fanoutqa/dev.json "$OUT/queries.txt"
SYN="$OUT/synthetic-$N.jsonl"
[ -s "$SYN" ] || python3 bench/make_search_data.py synthetic data/wiki/corpus.jsonl "$N" "$SYN"

echo "# fan-out (retriever backend, L = 200 ms)"
"$B" fanout --latency-ms 200 --reps 5

for corpus in data/wiki/corpus.jsonl "$SYN"; do
    echo "# $corpus"
    rm -rf "$OUT/tantivy-index" "$OUT/bm25s-index"
    "$B" tantivy --corpus "$corpus" --index "$OUT/tantivy-index" --queries "$OUT/queries.txt"
    python3 bench/bm25s_bench.py "$corpus" "$OUT/queries.txt" "$OUT/bm25s-index"
done
