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
# Installs llama-cpp-python 0.3.36 with pip if it is missing (builds llama.cpp from
# source, ~5 min). Needs the default model and index (scripts/fetch-defaults.sh).
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
GGUF=models/SmolLM2-135M-Instruct.Q4_1.gguf
OUT=target/bench-engine
mkdir -p "$OUT"

python3 -c "import llama_cpp" 2>/dev/null ||
    python3 -m pip install -q llama-cpp-python==0.3.36
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
            $BENCH --gguf "$GGUF" --weights "$w" --docs "$docs" --max-tokens "$max" --runs 1 \
                --prompt-out "$OUT/$name.txt" >"$OUT/last.txt" 2>"$OUT/last.err"
            tag "$OUT/last.txt" seeker "$w" "$name" >>"$OUT/runs.jsonl"
            python3 bench/llama_cpp_bench.py "$OUT/$name.txt" --gguf "$GGUF" --max-tokens "$max" \
                --runs 1 >"$OUT/last.txt" 2>"$OUT/last.err"
            tag "$OUT/last.txt" llama.cpp q4_1 "$name" >>"$OUT/runs.jsonl"
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
    print(f"| {prompt} | llama.cpp (2 threads) | Q4_1 | {ref[0]['prompt_tokens']} | {ref_p:.0f} | {ref_d:.0f} | 1 | 1 |")
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
