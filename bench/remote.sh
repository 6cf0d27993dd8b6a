#!/usr/bin/env bash
# Remote-engine benchmark: the same N FanOutQA sub-questions (default 20, the first
# whose evidence is in the default corpus), the same GGUF (SmolLM2-135M Q4_1), the
# default policy (search-r1-prefetch), greedy, MAX new tokens, run by
#   1. seeker with its embedded engine (mistral.rs, 2 threads);
#   2. seeker with one remote llama.cpp server (xllamacpp wheel, 2 threads);
#   3. the reference Python loop (bench/reference_loop.py: bm25s + the same
#      llama.cpp server, one question after another);
#   4. 8 concurrent clients: seeker on one server (2 threads, 2 slots) and on two
#      servers (1 thread each, 2 slots each) — this machine has 2 cores.
# Also seeker's own time per round on the remote engine, from its metrics: rollout
# time less the engine's stream time and the search time.
#
# Needs the default data (scripts/fetch-defaults.sh). Installs xllamacpp
# (scripts/llama-venv.sh) and bm25s/PyStemmer into target/llama-venv.
# Output: a markdown table on stdout; raw files in target/bench-remote/.
#
# usage: bench/remote.sh        N=20 MAX=128 bench/remote.sh
set -euo pipefail
cd "$(dirname "$0")/.."

N=${N:-20}
MAX=${MAX:-128}
OUT=target/bench-remote
GGUF=models/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$OUT"
PY=$(scripts/llama-venv.sh)
"$PY" -c "import bm25s, Stemmer" 2>/dev/null ||
    "$PY" -m pip install -q bm25s==0.3.16 PyStemmer==3.1.0
cargo build --release --locked -q --bin seeker
SEEKER=target/release/seeker
# llama, seeker, stop_all
source bench/servers.sh

# evaluate NAME URL CONCURRENCY
evaluate() {
    "$SEEKER" eval --dataset data/fanoutqa/dev.json --fanoutqa-subquestions \
        --evidence-in data/wiki/corpus.jsonl --limit "$N" --max-tokens "$MAX" \
        --concurrency "$3" --url "$2" --out "$OUT/$1.jsonl" >"$OUT/$1.table"
    curl -s "$2/metrics" >"$OUT/$1.metrics"
}

URL=$(seeker)
evaluate embedded "$URL" 1
stop_all

# Every run gets fresh servers: llama.cpp keeps earlier prompts in its cache
# (slots and host RAM), which would favour whatever runs second.
LLAMA=$(llama 2)
URL=$(seeker SEEKER_MODEL__ENGINE=remote SEEKER_MODEL__REMOTE_URLS="$LLAMA")
evaluate remote1 "$URL" 1
stop_all

LLAMA=$(llama 2)
"$PY" bench/reference_loop.py "$OUT/remote1.jsonl" data/wiki/corpus.jsonl "$LLAMA" \
    --max-tokens "$MAX" >"$OUT/reference.json"
stop_all

LLAMA=$(llama 2)
URL=$(seeker SEEKER_MODEL__ENGINE=remote SEEKER_MODEL__REMOTE_URLS="$LLAMA")
evaluate remote1-c8 "$URL" 8
stop_all

A=$(llama 1)
B=$(llama 1)
URL=$(seeker SEEKER_MODEL__ENGINE=remote SEEKER_MODEL__REMOTE_URLS="$A,$B")
evaluate remote2-c8 "$URL" 8
stop_all

python3 - "$OUT" "$N" <<'PY'
import json, re, sys
out, n = sys.argv[1], int(sys.argv[2])

def summary(name):
    return json.load(open(f"{out}/{name}.summary.json"))

def metric(name, key):
    text = open(f"{out}/{name}.metrics").read()
    return sum(float(v) for v in re.findall(rf"^{key}(?:{{[^}}]*}})? (\S+)$", text, re.M))

print(f"| run | clients | s/question (mean, p50) | questions/s | EM | F1 |")
print("|---|---|---|---|---|---|")
rows = [("seeker, embedded engine", "embedded", 1),
        ("seeker, 1 llama.cpp server (2 threads)", "remote1", 1),
        ("seeker, 1 llama.cpp server (2 threads)", "remote1-c8", 8),
        ("seeker, 2 llama.cpp servers (1 thread each)", "remote2-c8", 8)]
for label, name, clients in rows:
    s = summary(name)
    q = s["seconds_per_question"]
    print(f"| {label} | {clients} | {q['mean']:.2f}, {q['p50']:.2f} | "
          f"{s['completed'] / s['wall_seconds']:.2f} | {s['em']:.3f} | {s['f1']:.3f} |")
r = json.load(open(f"{out}/reference.json"))
print(f"| reference Python loop (bm25s + the same llama.cpp server) | 1 | "
      f"{r['seconds_mean']:.2f}, {r['seconds_p50']:.2f} | {1 / r['seconds_mean']:.2f} | | |")
print(f"\nreference loop: prompt {r['prompt_tokens_mean']:.0f} tokens, "
      f"generated {r['generated_tokens_mean']:.1f} tokens per question")
for name in ["embedded", "remote1"]:
    prompt = metric(name, "seeker_prompt_tokens_total") / n
    generated = metric(name, "seeker_generated_tokens_total") / n
    print(f"{name}: prompt {prompt:.0f} tokens, generated {generated:.1f} tokens per question")
for name in ["remote1", "remote1-c8", "remote2-c8"]:
    rollouts = metric(name, "seeker_rollout_duration_seconds_sum")
    engine = metric(name, "seeker_engine_round_duration_seconds_sum")
    search = metric(name, "seeker_search_duration_seconds_sum")
    rounds = metric(name, "seeker_engine_round_duration_seconds_count")
    own = (rollouts - engine - search) / max(rounds, 1) * 1000
    cached = metric(name, "seeker_prompt_tokens_cached_total")
    prompt = metric(name, "seeker_prompt_tokens_total")
    print(f"\n{name}: {int(rounds)} engine rounds; seeker's own time per round "
          f"(rollout - engine stream - search) = {own:.2f} ms; prompt tokens from the "
          f"server's cache {int(cached)} of {int(prompt)}")
PY
