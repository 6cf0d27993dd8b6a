#!/usr/bin/env bash
# Which policy and which retriever answer questions, on a benchmark whose answers only a search
# finds: PhantomWiki (arXiv 2502.20377), a generated universe of fictional people
# (scripts/phantomwiki.sh). Every policy x backend runs `seeker eval` on the same questions,
# greedy, the default model, and the table says set F1 (PhantomWiki's score), how often the
# model searched itself, the supporting articles its searches found, and the time a question.
#
#   1. generates the universe and its BM25 and dense indexes (scripts/phantomwiki.sh);
#   2. for each policy and backend: a fresh seeker server over the universe's index (embedded
#      engine, config/seeker.toml, search.index pointed at the universe), then `seeker eval` on
#      its questions of at most MAX_DIFFICULTY hops, "How many" questions left out unless
#      AGGREGATION=1;
#   3. the table, in markdown, on stdout and in $OUT/table.md (bench/phantomwiki_table.py).
# A cell whose results exist is not run again (RERUN=1 runs it anyway), so an interrupted run
# goes on where it stopped. `direct` searches nothing, so it runs once, not per backend.
#
# usage: bench/phantomwiki.sh
#        SEED=2 bench/phantomwiki.sh                     (another universe, same table)
#        POLICIES="rag search-r1 tool-search" BACKENDS=tantivy bench/phantomwiki.sh
#        MAX_DIFFICULTY=10 AGGREGATION=1 bench/phantomwiki.sh   (all 200 questions)
#        SIZE=50k POLICIES=tool-search BACKENDS=tantivy bench/phantomwiki.sh
# Env: SEED (1), SIZE (5k: 500, 5k or 50k), POLICIES, BACKENDS (tantivy dense hybrid),
#      MAX_DIFFICULTY (3), AGGREGATION (0), LIMIT (all), MAX (512 generated tokens a question),
#      SEEKER_BIN (default: the release build), OUT (target/bench-phantomwiki/seed{S}-{SIZE}),
#      SERVER_ENV (more SEEKER_*=... settings for every server, e.g. a tuned top-k),
#      INSTRUCTION (text put before every question, `seeker eval --instruction`; none by default),
#      TOP_K (documents a search, `seeker eval --top-k`; default: each profile's own, 3).
#
# The answers are sets, scored as PhantomWiki scores them (split on commas), after reading an
# answer written as a sentence from its last clause (`seeker eval`; docs/evaluation.md "PhantomWiki").
# Each policy keeps its own prompt: asking for "names only, separated by commas" before the
# question (the paper's agents are asked so) made tool-search answer without searching
# (0 of 6 questions searched), so no instruction is the default.
set -euo pipefail
cd "$(dirname "$0")/.."

SEED=${SEED:-1}
SIZE=${SIZE:-5k}
# Every shipped profile that answers a question from a corpus: the two baselines, then the
# agentic policies (text tags, then tool calls). Left out: none; page-reading profiles open
# corpus articles by title, as they would web pages.
POLICIES=${POLICIES:-direct rag ircot search-r1-prefetch search-r1 zerosearch stepsearch parallelsearch r-search rag-r1-sq rag-r1-mq r1-searcher r1-searcher-instruct r1-searcher-plus research asearcher recall tool-search deepresearcher tongyi-deepresearch}
BACKENDS=${BACKENDS:-tantivy dense hybrid}
MAX_DIFFICULTY=${MAX_DIFFICULTY:-3}
AGGREGATION=${AGGREGATION:-0}
LIMIT=${LIMIT:-}
MAX=${MAX:-512}
INSTRUCTION=${INSTRUCTION:-}
TOP_K=${TOP_K:-}
UNIVERSE=data/phantomwiki/seed$SEED-$SIZE
OUT=${OUT:-target/bench-phantomwiki/seed$SEED-$SIZE}
mkdir -p "$OUT"

if [[ -n ${SEEKER_BIN:-} ]]; then
    SEEKER=$SEEKER_BIN
else
    cargo build --release --locked -q --bin seeker
    SEEKER=target/release/seeker
fi
dense_flag=()
[[ " $BACKENDS " == *" dense "* || " $BACKENDS " == *" hybrid "* ]] || dense_flag=(--no-dense)
SEEKER_BIN=$SEEKER scripts/phantomwiki.sh --seed "$SEED" --size "$SIZE" "${dense_flag[@]}"

# seeker, stop_all (bench/servers.sh)
source bench/servers.sh

filters=(--max-difficulty "$MAX_DIFFICULTY")
[[ $AGGREGATION == 1 ]] || filters+=(--no-aggregation)
[[ -z $LIMIT ]] || filters+=(--limit "$LIMIT")
[[ -z $INSTRUCTION ]] || filters+=(--instruction "$INSTRUCTION")
[[ -z $TOP_K ]] || filters+=(--top-k "$TOP_K")
read -r -a server_env <<<"${SERVER_ENV:-}"

for policy in $POLICIES; do
    backends=$BACKENDS
    [[ $policy == direct ]] && backends=none
    for backend in $backends; do
        name=$policy.$backend
        if [[ -f $OUT/$name.summary.json && ${RERUN:-0} != 1 ]]; then
            echo "phantomwiki: $name done" >&2
            continue
        fi
        url=$(seeker SEEKER_SEARCH__INDEX="$UNIVERSE/index" "${server_env[@]}")
        [[ -n $url ]] || { echo "phantomwiki: the server did not start (see $OUT/seeker.err)" >&2; exit 1; }
        backend_flag=()
        [[ $backend == none ]] || backend_flag=(--backend "$backend")
        echo "phantomwiki: $name" >&2
        "$SEEKER" eval --dataset "$UNIVERSE/questions.jsonl" "${filters[@]}" --max-tokens "$MAX" \
            --policy "$policy" "${backend_flag[@]}" --url "$url" --out "$OUT/$name.jsonl" \
            >"$OUT/$name.table"
        stop_all
    done
done

python3 bench/phantomwiki_table.py "$OUT" $POLICIES | tee "$OUT/table.md"
