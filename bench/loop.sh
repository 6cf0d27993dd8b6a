#!/usr/bin/env bash
# Per-question cost of seeker against the Python loop a policy's authors write
# (issue 26): the default model (Qwen2.5-Coder-1.5B-Instruct Q4_K_M) under
# Search-R1's protocol (`search-r1`: the model writes its own searches, up to
# 4 rounds of search), greedy, MAX tokens a question, the same N FanOutQA dev
# sub-questions (after the first SKIP whose evidence is in the default
# corpus), run by
#   1. seeker on one llama.cpp server (xllamacpp wheel, 2 threads, 1 slot),
#      later rounds as token ids (model.token_continuation, the default);
#   1b. the same, each question asked without streaming (`seeker eval
#      --no-stream`: one JSON answer, as the loop takes one per round);
#   2. the same as 1 with token_continuation = false (every round sent as text);
#   3. the reference Python loop over one llama.cpp server (bench/reference_loop.py
#      --policy search-r1: Search-R1's infer.py loop, the prompt re-sent as text
#      each round, the queries sent to a seeker's POST /retrieve as infer.py
#      sends them to its retrieval server, so it reads the same documents);
#   4. seeker with its embedded engine (mistral.rs); embedded-before: the same with the
#      seeker binary BEFORE_BIN (an older build, for a before/after in one session);
#   5. throughput: CLIENTS clients (default 4) over TN questions (default 20)
#      on seeker over one llama.cpp server with 1 slot and with CLIENTS slots;
#      the loop's throughput is its single-client rate (it runs one question
#      after another); embedded-throughput: CLIENTS clients over TN questions on
#      the embedded engine with max_num_seqs 1 and CLIENTS.
# Each run gets fresh servers: llama.cpp keeps earlier prompts in its cache,
# which would favour whatever runs second on the same questions.
#
# Needs the default data (scripts/fetch-defaults.sh). Installs xllamacpp
# (scripts/llama-venv.sh) and bm25s/PyStemmer into target/llama-venv.
# Output: a markdown table on stdout; raw files in target/bench-loop/.
#
# usage: bench/loop.sh     N=10 SKIP=100 MAX=256 CLIENTS=4 TN=20 bench/loop.sh
#        STEPS="reference" bench/loop.sh   (rerun some steps: remote remote-whole remote-text
#        reference embedded throughput, or throughput-slots for its CLIENTS-slot half
#        alone; the table shows every step with results
#        in target/bench-loop and names those without)
#        SEEKER_BIN=target/debug/seeker bench/loop.sh   (no release build; the
#        debug profile builds the engine's dependencies optimised)
set -euo pipefail
cd "$(dirname "$0")/.."

N=${N:-10}
SKIP=${SKIP:-100}
MAX=${MAX:-256}
CLIENTS=${CLIENTS:-4}
TN=${TN:-20}
STEPS=${STEPS:-remote remote-whole remote-text reference embedded throughput}
OUT=target/bench-loop
GGUF=models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
for step in $STEPS; do
    case $step in
    remote | remote-whole | remote-text | reference | embedded | embedded-before | throughput | throughput-slots | embedded-throughput) ;;
    *) echo "bench/loop.sh: unknown step '$step' (steps: remote remote-whole remote-text reference embedded embedded-before throughput throughput-slots embedded-throughput)" >&2
       exit 2 ;;
    esac
done
mkdir -p "$OUT"
PY=$(scripts/llama-venv.sh)
"$PY" -c "import bm25s, Stemmer" 2>/dev/null ||
    "$PY" -m pip install -q bm25s==0.3.16 PyStemmer==3.1.0
if [[ -n ${SEEKER_BIN:-} ]]; then
    SEEKER=$SEEKER_BIN
else
    cargo build --release --locked -q --bin seeker
    SEEKER=target/release/seeker
fi
# llama, seeker, stop_all
source bench/servers.sh

# evaluate NAME URL CONCURRENCY QUESTIONS [EVAL ARGS...]
evaluate() {
    "$SEEKER" eval --dataset data/fanoutqa/dev.json --fanoutqa-subquestions \
        --evidence-in data/wiki/corpus.jsonl --skip "$SKIP" --limit "$4" --max-tokens "$MAX" \
        --policy search-r1 --concurrency "$3" --url "$2" --out "$OUT/$1.jsonl" "${@:5}" >"$OUT/$1.table"
    curl -s "$2/metrics" >"$OUT/$1.metrics"
}

remote() { seeker SEEKER_MODEL__ENGINE=remote SEEKER_MODEL__REMOTE_URLS="$1" "${@:2}"; }

# reference NAME QUESTIONS.jsonl: the loop over a fresh llama.cpp server; its
# queries go to a seeker's POST /retrieve (the same index and top 3 as
# seeker's own searches, so both read the same documents).
reference() {
    local llama
    llama=$(llama 2 1)
    "$PY" bench/reference_loop.py "$2" data/wiki/corpus.jsonl "$llama" \
        --policy search-r1 --max-tokens "$MAX" --retriever "$(remote "$llama")" >"$OUT/$1.json"
}

for step in $STEPS; do
    case $step in
    remote) evaluate remote "$(remote "$(llama 2 1)")" 1 "$N" ;;
    remote-whole) evaluate remote-whole "$(remote "$(llama 2 1)")" 1 "$N" --no-stream ;;
    remote-text)
        evaluate remote-text "$(remote "$(llama 2 1)" SEEKER_MODEL__TOKEN_CONTINUATION=false)" 1 "$N" ;;
    reference)
        "$SEEKER" eval --dataset data/fanoutqa/dev.json --fanoutqa-subquestions \
            --evidence-in data/wiki/corpus.jsonl --skip "$SKIP" --limit "$TN" --retrieval-only \
            --out "$OUT/questions.jsonl" >/dev/null
        head -n "$N" "$OUT/questions.jsonl" >"$OUT/questions-n.jsonl"
        reference reference "$OUT/questions-n.jsonl"
        stop_all
        # The loop's single-client rate on the throughput questions.
        reference reference-tn "$OUT/questions.jsonl" ;;
    embedded) evaluate embedded "$(seeker)" 1 "$N" ;;
    embedded-before)
        [[ -n ${BEFORE_BIN:-} ]] || { echo "bench/loop.sh: embedded-before needs BEFORE_BIN" >&2; exit 2; }
        evaluate embedded-before "$(SEEKER=$BEFORE_BIN seeker)" 1 "$N" ;;
    embedded-throughput)
        evaluate embedded-c"$CLIENTS"-1seq "$(seeker)" "$CLIENTS" "$TN"
        stop_all
        evaluate embedded-c"$CLIENTS"-"$CLIENTS"seqs "$(seeker SEEKER_MODEL__MAX_NUM_SEQS="$CLIENTS")" "$CLIENTS" "$TN" ;;
    throughput)
        evaluate remote-c"$CLIENTS"-1slot "$(remote "$(llama 2 1)")" "$CLIENTS" "$TN"
        stop_all
        evaluate remote-c"$CLIENTS"-"$CLIENTS"slots "$(remote "$(llama 2 "$CLIENTS")")" "$CLIENTS" "$TN" ;;
    throughput-slots)
        evaluate remote-c"$CLIENTS"-"$CLIENTS"slots "$(remote "$(llama 2 "$CLIENTS")")" "$CLIENTS" "$TN" ;;
    esac
    stop_all
done

python3 - "$OUT" "$N" "$TN" "$CLIENTS" <<'PY'
import json, sys
out, n, tn, clients = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

print("| run | clients | questions | s/question mean (p50) | questions/min | prompt tokens / q | "
      "prefilled / q | generated / q | searches / q | EM | F1 |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
rows = [("seeker, llama.cpp, token ids", "remote", 1, n),
        ("seeker, llama.cpp, token ids, not streamed", "remote-whole", 1, n),
        ("seeker, llama.cpp, text", "remote-text", 1, n),
        ("seeker, embedded (mistral.rs)", "embedded", 1, n),
        ("seeker, embedded, BEFORE_BIN", "embedded-before", 1, n),
        ("seeker, embedded, max_num_seqs 1", f"embedded-c{clients}-1seq", clients, tn),
        (f"seeker, embedded, max_num_seqs {clients}", f"embedded-c{clients}-{clients}seqs", clients, tn),
        ("seeker, llama.cpp 1 slot", f"remote-c{clients}-1slot", clients, tn),
        (f"seeker, llama.cpp {clients} slots", f"remote-c{clients}-{clients}slots", clients, tn)]
missing = []
for label, name, c, count in rows:
    try:
        s = json.load(open(f"{out}/{name}.summary.json"))
    except FileNotFoundError:
        missing.append(name)
        continue
    q = s["seconds_per_question"]
    print(f"| {label} | {c} | {count} | {q['mean']:.1f} ({q['p50']:.1f}) | "
          f"{60 * s['completed'] / s['wall_seconds']:.2f} | {s['prompt_tokens_per_question']:.0f} | "
          f"{s['prefilled_tokens_per_question']:.0f} | {s['generated_tokens_per_question']:.1f} | "
          f"{s['searches_per_question']:.2f} | {s['em']:.3f} | {s['f1']:.3f} |")
for label, name, count in [("reference loop, llama.cpp", "reference", n),
                           ("reference loop, llama.cpp", "reference-tn", tn)]:
    try:
        r = json.load(open(f"{out}/{name}.json"))
    except FileNotFoundError:
        missing.append(name)
        continue
    print(f"| {label} | 1 | {count} | {r['seconds_mean']:.1f} ({r['seconds_p50']:.1f}) | "
          f"{60 / r['seconds_mean']:.2f} | {r['prompt_tokens_mean']:.0f} | "
          f"{r['prefilled_tokens_mean']:.0f} | {r['generated_tokens_mean']:.1f} | "
          f"{r['searches_mean']:.2f} | | |")
if missing:
    print(f"\nno results yet for {', '.join(missing)} in {out}: run their steps (STEPS=...)")
PY
