#!/usr/bin/env bash
# The embedded engine's kernels side by side (issue 46): prefill and decode tok/s of several
# engine_bench builds (e.g. candle 0.10, candle 0.11, candle 0.11 with the prompt-attention
# edit) and llama.cpp, on the default model and the same prompt text, alternating, in one run.
#
# For each length in LENGTHS (prompt tokens, default "500 4000"): examples/engine_bench.rs
# --prompt-tokens N builds the Search-R1 prompt for "Who painted the Mona Lisa?" with the
# fewest top documents of the default index that reach N tokens, prefills it and decodes
# DECODE tokens (default 64) greedily; bench/llama_cpp_bench.py (the pinned xllamacpp
# server, 2 threads, cache_prompt false) runs the same text. RUNS rounds (default 2) of
# every build then llama.cpp; the table gives medians.
#
# BUILDS: "label=path ..." of engine_bench binaries (default: this tree's release build as
# "now"). Build an older one with `git worktree add` + `cargo build --release --example
# engine_bench`, or keep a copy before a change (cp target/release/examples/engine_bench
# target/before/engine_bench).
# Every seeker run gets CANDLE_BARRIER_POOL_SPIN_LIMIT=2000 (what `seeker serve` sets).
#
# Output: a markdown table on stdout; raw runs in $OUT (default target/bench-kernels).
#
# usage: bench/kernels.sh
#        BUILDS="before=target/before/engine_bench now=target/release/examples/engine_bench" \
#          LENGTHS="500 4000" RUNS=2 bench/kernels.sh
set -euo pipefail
cd "$(dirname "$0")/.."

LENGTHS=${LENGTHS:-"500 4000"}
RUNS=${RUNS:-2}
DECODE=${DECODE:-64}
OUT=${OUT:-target/bench-kernels}
GGUF=models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
if [[ -z ${BUILDS:-} ]]; then
    cargo build --release --locked -q --example engine_bench
    BUILDS="now=target/release/examples/engine_bench"
fi
[[ -f $GGUF ]] || { echo "bench/kernels.sh: $GGUF is missing: run scripts/fetch-defaults.sh" >&2; exit 1; }
LLAMA_PY=$(scripts/llama-venv.sh)
mkdir -p "$OUT"
: >"$OUT/runs.jsonl"

# tag FILE ENGINE LENGTH: engine_bench / llama_cpp_bench JSON lines with their labels.
tag() {
    python3 -c 'import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        if "prefill_tok_s" in r:
            r.update(engine=sys.argv[2], length=int(sys.argv[3]))
            print(json.dumps(r))' "$@"
}

for n in $LENGTHS; do
    for run in $(seq 1 "$RUNS"); do
        for spec in $BUILDS; do
            label=${spec%%=*} bin=${spec#*=}
            echo "kernels: $label at $n tokens, run $run" >&2
            CANDLE_BARRIER_POOL_SPIN_LIMIT=2000 "$bin" --gguf "$GGUF" \
                --profile config/policies/search-r1.toml --prompt-tokens "$n" \
                --max-tokens "$DECODE" --runs 1 --prompt-out "$OUT/prompt-$n.txt" \
                >"$OUT/last.txt" 2>"$OUT/last.err" ||
                { echo "kernels: $label failed (see $OUT/last.err)" >&2; exit 1; }
            tag "$OUT/last.txt" "$label" "$n" >>"$OUT/runs.jsonl"
        done
        echo "kernels: llama.cpp at $n tokens, run $run" >&2
        "$LLAMA_PY" bench/llama_cpp_bench.py "$OUT/prompt-$n.txt" --gguf "$GGUF" \
            --max-tokens "$DECODE" --runs 1 --ctx $((n + DECODE + 512)) \
            >"$OUT/last.txt" 2>"$OUT/last.err"
        tag "$OUT/last.txt" llama.cpp "$n" >>"$OUT/runs.jsonl"
    done
done

python3 - "$OUT/runs.jsonl" $BUILDS <<'PY'
import json
import statistics
import sys

runs = [json.loads(l) for l in open(sys.argv[1])]
engines = [s.split("=", 1)[0] for s in sys.argv[2:]] + ["llama.cpp"]
med = lambda xs: statistics.median(xs) if xs else float("nan")
print("| engine | prompt tokens | prefill tok/s | time to first token | decode tok/s | prefill / llama.cpp | decode / llama.cpp | runs |")
print("|---|---|---|---|---|---|---|---|")
for n in sorted({r["length"] for r in runs}):
    ref = [r for r in runs if r["length"] == n and r["engine"] == "llama.cpp"]
    ref_p = med([r["prefill_tok_s"] for r in ref])
    ref_d = med([r["decode_tok_s"] for r in ref])
    for e in engines:
        mine = [r for r in runs if r["length"] == n and r["engine"] == e]
        if not mine:
            continue
        p = med([r["prefill_tok_s"] for r in mine])
        d = med([r["decode_tok_s"] for r in mine])
        tokens = mine[0]["prompt_tokens"]
        print(f"| {e} | {tokens:,} | {p:.1f} | {tokens / p:.1f} s | {d:.1f} | {p / ref_p:.2f} | {d / ref_d:.2f} | {len(mine)} |")
PY
