#!/usr/bin/env bash
# Serving a Hugging Face checkpoint against serving the GGUF it was made from, side by side
# in one run on this machine: the default GGUF (Qwen2.5-Coder-1.5B Q4_K_M) as it is, and
# its Hugging Face conversion (scripts/hf-from-gguf.sh: F16 safetensors, 4 shards)
# loaded by mistral.rs's plain loader with in-situ quantization (ISQ) q4k, q8_0, and none.
#
# For each: examples/engine_bench.rs on the Search-R1 prompt with 3 spliced documents (545
# prompt tokens, 64 new tokens, RUNS runs): load time (weights read, quantized, warm-up
# run), resident memory after the load, prefill and decode tok/s; then a seeker server
# on it and `seeker eval` on the first N FanOutQA sub-questions whose evidence is in the
# default corpus (search-r1, greedy, MAX new tokens): seconds per question, EM/F1,
# searches, and the server's peak resident memory (VmHWM). Then the fidelity to the
# GGUF: examples/logprob_probe.rs `kernels` on each (10 prompts: Search-R1 rounds 1 and 2,
# tool-search, PhantomWiki), its top-10 next-token log-probs and 48 greedy tokens set
# against the GGUF's.
#
# PARTS (default "engine eval fidelity") picks the parts, NAMES (default "gguf hf-q4k
# hf-q8_0 hf-none") the weights; the tables are made from whatever files are in $OUT.
#
# Needs the default data (scripts/fetch-defaults.sh --no-index) and the index.
# usage: bench/checkpoint.sh    N=10 RUNS=2 SEEKER=target/debug/seeker \
#            BENCH=target/debug/examples/engine_bench PROBE=target/debug/examples/logprob_probe \
#            PARTS="engine eval fidelity" bench/checkpoint.sh
# Output: a markdown table on stdout; raw files in target/bench-checkpoint/.
set -euo pipefail
cd "$(dirname "$0")/.."

N=${N:-10}
RUNS=${RUNS:-2}
MAX=${MAX:-256}
OUT=target/bench-checkpoint
GGUF=models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
DIR=target/hf/qwen2.5-coder-1.5b-instruct-f16
mkdir -p "$OUT"
PARTS=${PARTS:-engine eval fidelity}
if [[ -z ${SEEKER:-} || -z ${BENCH:-} || -z ${PROBE:-} ]]; then
    cargo build --release --locked -q --bin seeker --example engine_bench --example logprob_probe
fi
SEEKER=${SEEKER:-target/release/seeker}
BENCH=${BENCH:-target/release/examples/engine_bench}
PROBE=${PROBE:-target/release/examples/logprob_probe}
[[ -f $DIR/config.json ]] || scripts/hf-from-gguf.sh "$GGUF" "$DIR" >&2
export CANDLE_BARRIER_POOL_SPIN_LIMIT=2000

# name -> engine_bench / seeker serve arguments
declare -A ARGS=(
    [gguf]="--gguf $GGUF"
    [hf-q4k]="--checkpoint $DIR --isq q4k"
    [hf-q8_0]="--checkpoint $DIR --isq q8_0"
    [hf-none]="--checkpoint $DIR --isq none"
)
declare -A SERVE=(
    [gguf]="--model $GGUF"
    [hf-q4k]="--model $DIR --isq q4k"
    [hf-q8_0]="--model $DIR --isq q8_0"
    [hf-none]="--model $DIR --isq none"
)
NAMES=${NAMES:-gguf hf-q4k hf-q8_0 hf-none}

for name in $NAMES; do
    [[ " $PARTS " == *" engine "* ]] || continue
    # shellcheck disable=SC2086
    "$BENCH" ${ARGS[$name]} --profile config/policies/search-r1.toml --docs 3 \
        --max-tokens 64 --runs "$RUNS" --prompt-out "$OUT/prompt.txt" \
        >"$OUT/$name.engine.jsonl" 2>"$OUT/$name.engine.err"
done

for name in $NAMES; do
    [[ " $PARTS " == *" eval "* ]] || continue
    log=$(mktemp)
    # shellcheck disable=SC2086
    RUST_LOG=warn "$SEEKER" serve --port 0 ${SERVE[$name]} >"$log" 2>"$OUT/$name.serve.err" &
    pid=$!
    for _ in $(seq 1 600); do grep -q "listening on" "$log" && break; sleep 0.1; done
    url=$(sed -n 's/^seeker listening on //p' "$log")
    until curl -sf "$url/health" >/dev/null; do
        kill -0 "$pid" || { echo "$name: the server exited" >&2; exit 1; }
        sleep 0.5
    done
    "$SEEKER" eval --dataset data/fanoutqa/dev.json --fanoutqa-subquestions \
        --evidence-in data/wiki/corpus.jsonl --limit "$N" --max-tokens "$MAX" \
        --policy search-r1 --url "$url" --out "$OUT/$name.eval.jsonl" >"$OUT/$name.eval.table"
    grep VmHWM "/proc/$pid/status" | awk '{print int($2/1024)}' >"$OUT/$name.hwm_mib"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
done

for name in $NAMES; do
    [[ " $PARTS " == *" fidelity "* ]] || continue
    # shellcheck disable=SC2086
    "$PROBE" kernels ${ARGS[$name]} >"$OUT/$name.probe.jsonl" 2>"$OUT/$name.probe.err"
done

python3 - "$OUT" <<'PY'
import json, os, statistics, sys
out = sys.argv[1]
names = [n for n in ["gguf", "hf-q4k", "hf-q8_0", "hf-none"] if os.path.exists(f"{out}/{n}.engine.jsonl")]
print("| weights | load s | RSS after load MiB | prefill tok/s | decode tok/s | s / question | EM | F1 | searches / question | server peak RSS MiB |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name in names:
    runs = [json.loads(l) for l in open(f"{out}/{name}.engine.jsonl") if '"run"' in l]
    med = lambda k: statistics.median(r[k] for r in runs)
    row = [name, f"{runs[0]['load_s']:.1f}", str(runs[0]["rss_mib_after_load"]),
           f"{med('prefill_tok_s'):.1f}", f"{med('decode_tok_s'):.2f}"]
    summary = f"{out}/{name}.eval.summary.json"
    if os.path.exists(summary):
        s = json.load(open(summary))
        row += [f"{s['seconds_per_question']['mean']:.1f}", f"{s['em']:.2f}", f"{s['f1']:.2f}",
                f"{s['searches_per_question']:.1f}", open(f"{out}/{name}.hwm_mib").read().strip()]
    else:
        row += ["—"] * 5
    print("| " + " | ".join(row) + " |")
PY

python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
names = [n for n in ["gguf", "hf-q4k", "hf-q8_0", "hf-none"] if os.path.exists(f"{out}/{n}.probe.jsonl")]
if "gguf" in names and len(names) > 1:
    runs = {n: [json.loads(l) for l in open(f"{out}/{n}.probe.jsonl")] for n in names}
    ref = runs["gguf"]
    print()
    print("| weights | top-1 = the GGUF's | max Δ log-prob (the GGUF's top 5) | median Δ | greedy text = the GGUF's (48 tokens) |")
    print("|---|---|---|---|---|")
    for name in names[1:]:
        worst, top1, same = [], 0, 0
        for mine, theirs in zip(runs[name], ref):
            assert mine["ids"] == theirs["ids"], f"{name}: another tokenization of {mine['name']}"
            lp = dict((i, p) for i, p in mine["top"])
            worst.append(max(abs(lp[i] - p) if i in lp else float("inf") for i, p in theirs["top"][:5]))
            top1 += mine["top"][0][0] == theirs["top"][0][0]
            same += mine["greedy"] == theirs["greedy"]
        worst.sort()
        print(f"| {name} | {top1} of {len(ref)} | {worst[-1]:.3f} | {worst[len(worst) // 2]:.3f} | {same} of {len(ref)} |")
PY
