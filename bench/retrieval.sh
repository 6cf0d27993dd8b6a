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
# the same questions) a second table scores the queries the model wrote there;
# with CAPTURE=POLICY (e.g. search-r1, the default profile, or tool-search) the
# script first writes that file itself: the default model on one llama.cpp
# server (xllamacpp, 2 threads; seeker's remote engine, the default config
# otherwise) answers the same LIMIT questions under POLICY, and the queries it
# wrote are scored (~40 minutes for 300 questions on 2 cores).
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
#        CAPTURE=search-r1 bench/retrieval.sh
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

run() { # backend clients name [extra args...]
    local backend=$1 clients=$2 name=$3
    shift 3
    echo "## $backend, $clients clients $*"
    "$SEEKER_BIN" eval --retrieval-only --dataset data/fanoutqa/dev.json \
        --fanoutqa-subquestions --answer-in data/wiki/corpus.jsonl --limit "$LIMIT" \
        --backend "$backend" --top-k 5 --concurrency "$clients" \
        --out "$OUT/$name.jsonl" "$@"
    echo
}

if [[ -n ${CAPTURE:-} ]]; then
    GGUF=models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
    SEEKER=$SEEKER_BIN
    PY=$(scripts/llama-venv.sh)
    # llama, seeker, stop_all
    source bench/servers.sh
    url=$(seeker SEEKER_MODEL__ENGINE=remote SEEKER_MODEL__REMOTE_URLS="$(llama 2 1)")
    QUERIES="$OUT/queries-$CAPTURE.jsonl"
    echo "## the default model's run under $CAPTURE (its queries are scored below)"
    "$SEEKER_BIN" eval --dataset data/fanoutqa/dev.json --fanoutqa-subquestions \
        --answer-in data/wiki/corpus.jsonl --limit "$LIMIT" --policy "$CAPTURE" \
        --url "$url" --out "$QUERIES"
    stop_all
    echo
fi

for clients in $CLIENTS; do
    for backend in $BACKENDS; do
        run "$backend" "$clients" "$backend-$clients"
    done
done
most=$(tr ' ' '\n' <<<"$CLIENTS" | sort -n | tail -1)
if [[ $most -gt 1 && " $BACKENDS " == *" dense "* ]]; then
    echo "## query batching off (search.dense.batch_size = 1)"
    SEEKER_SEARCH__DENSE__BATCH_SIZE=1 run dense "$most" "dense-$most-unbatched"
fi
if [[ -n ${QUERIES:-} ]]; then
    for backend in $BACKENDS; do
        run "$backend" 1 "$backend-queries" --queries-from "$QUERIES"
    done
    # Side by side on the questions the model searched for: its queries
    # against the question text (the 1-client runs above), per backend, and
    # each backend's gain over BM25 at 3.
    [[ " $CLIENTS " == *" 1 "* ]] || for backend in $BACKENDS; do
        run "$backend" 1 "$backend-1" >/dev/null
    done
    python3 - "$OUT" $BACKENDS <<'PY'
import json, sys
out, backends = sys.argv[1], sys.argv[2:]
def ranks(name):
    return {r["id"]: r["answer_rank"] for r in map(json.loads, open(f"{out}/{name}.jsonl"))}
def recall(rank_of, ids, k):
    return sum(1 for i in ids if rank_of[i] is not None and rank_of[i] <= k) / len(ids)
searched = sorted(ranks(f"{backends[0]}-queries"))
print(f"On the {len(searched)} questions the model searched for (answer recall @1 / @3 / @5):\n")
print("| backend | the model's queries | the question |")
print("|---|---|---|")
rows = {}
for b in backends:
    q, m = ranks(f"{b}-1"), ranks(f"{b}-queries")
    rows[b] = [[recall(r, searched, k) for k in (1, 3, 5)] for r in (m, q)]
    print(f"| `{b}` | " + " | ".join(" / ".join(f"{x:.3f}" for x in v) for v in rows[b]) + " |")
if "tantivy" in rows:
    print()
    for b in backends:
        if b != "tantivy":
            gain = [rows[b][i][1] - rows["tantivy"][i][1] for i in (0, 1)]
            print(f"- `{b}` over BM25 at 3: model's queries {gain[0]:+.3f}, the question {gain[1]:+.3f}")
PY
fi
