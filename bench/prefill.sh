#!/usr/bin/env bash
# Long-context prefill: the embedded engine against llama.cpp on the same prompt
# text, at growing prompt lengths, on both shipped models (issue 26 item 4).
#
# For each model and each length in LENGTHS (prompt tokens, default
# "500 1000 2000 4000 8000"): examples/engine_bench.rs builds the Search-R1 prompt
# with as many top documents spliced as reach that length (--prompt-tokens), prefills
# it with `weights = "auto"` (what `seeker serve` runs) and decodes one token; then
# bench/llama_cpp_bench.py (the pinned xllamacpp server, 2 threads, n_batch 512,
# cache_prompt false) prefills the same text. Alternating, RUNS pairs per point.
# SKIP lists "model:length" points seeker does not run (llama.cpp still does), for
# points that would take too long (the default model at 8000 took 14 min here).
#
# PERF="model:length" (e.g. "default:4000") also records a `perf` profile of that
# point's prefill alone (engine_bench --perf-ctl) and splits it with
# bench/perf_split.py; PERF_DECODE=model does the same for decoding (at most 64
# tokens after a 500-token prompt, six runs, the prefix cache on as in `seeker serve`). perf must be installed and usable (root, or
# perf_event_paranoid <= 1).
#
# KEEP=1 keeps the other points' runs from an earlier run in the same $OUT.
# BENCH=path runs that engine_bench binary instead of building this tree's.
#
# Output: a markdown report on stdout; raw runs in $OUT (default target/bench-prefill).
#
# usage: bench/prefill.sh
#        MODELS=small LENGTHS="500 4000" RUNS=1 bench/prefill.sh
#        MODELS=default LENGTHS= PERF_DECODE=default bench/prefill.sh   # the decode profile alone
#        MODELS=default SKIP="default:8000" PERF="default:4000" PERF_DECODE=default bench/prefill.sh
set -euo pipefail
cd "$(dirname "$0")/.."

MODELS=${MODELS:-"small default"}
LENGTHS=${LENGTHS-"500 1000 2000 4000 8000"}
RUNS=${RUNS:-1}
SKIP=${SKIP:-}
PERF=${PERF:-}
PERF_DECODE=${PERF_DECODE:-}
OUT=${OUT:-target/bench-prefill}

die() {
    echo "bench/prefill.sh: $*" >&2
    exit 2
}
gguf() {
    case $1 in
        small) echo models/SmolLM2-135M-Instruct.Q4_1.gguf ;;
        default) echo models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf ;;
    esac
}
profile() {
    case $1 in
        small) echo config/policies/search-r1-prefetch.toml ;;
        default) echo config/policies/search-r1.toml ;;
    esac
}
# Everything is checked before $OUT is touched (a typo must not empty runs.jsonl).
for m in $MODELS $PERF_DECODE; do
    [[ $m == small || $m == default ]] || die "unknown model '$m' (models: small default)"
    [[ -f $(gguf "$m") ]] || die "missing $(gguf "$m"): run scripts/fetch-defaults.sh"
done
for len in $LENGTHS; do
    [[ $len =~ ^[1-9][0-9]*$ ]] || die "LENGTHS: '$len' is not a number of prompt tokens"
done
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || die "RUNS: '$RUNS' is not a positive number of runs"
for point in $SKIP $PERF; do
    [[ $point =~ ^(small|default):[1-9][0-9]*$ ]] || die "SKIP/PERF: '$point' is not model:length (e.g. default:4000)"
done
if [[ -n $PERF$PERF_DECODE ]] && ! command -v perf >/dev/null; then
    die "PERF/PERF_DECODE need perf (apt-get install linux-perf)"
fi
mkdir -p "$OUT"

# step CMD... : runs one bench step (output in $OUT/last.txt); on failure shows
# why and stops.
step() {
    if ! "$@" >"$OUT/last.txt" 2>"$OUT/last.err"; then
        echo "bench/prefill.sh: failed: $*" >&2
        tail -n 20 "$OUT/last.err" >&2
        exit 1
    fi
}

LLAMA_PY=$(scripts/llama-venv.sh)
# BENCH: another engine_bench binary (e.g. one built from an older commit).
if [[ -z ${BENCH:-} ]]; then
    cargo build --release -q --example engine_bench
    BENCH=target/release/examples/engine_bench
fi

# The first JSON line of a run, with engine, model and target length added.
tag() {
    python3 -c "import json,sys
r = json.loads(open(sys.argv[1]).readline())
r.update(engine=sys.argv[2], model=sys.argv[3], target=int(sys.argv[4]))
print(json.dumps(r))" "$@"
}

# perf_run NAME PHASE HZ ENGINE_BENCH_ARGS... -> $OUT/NAME.perf.md
# Call graphs (DWARF, 4 KB of stack per sample) let bench/perf_split.py give the
# closures rayon runs to their owners.
perf_run() {
    local name=$1 phase=$2 hz=$3
    shift 3
    local fifo=$OUT/perf.ctl
    rm -f "$fifo"
    mkfifo "$fifo"
    step perf record -q -F "$hz" --call-graph dwarf,4096 -D -1 --control "fifo:$fifo" -o "$OUT/$name.perf.data" -- \
        "$BENCH" "$@" --perf-ctl "$fifo" --perf-phase "$phase"
    cp "$OUT/last.txt" "$OUT/$name.perf.txt"
    rm -f "$fifo"
    step python3 bench/perf_split.py "$OUT/$name.perf.data"
    cp "$OUT/last.txt" "$OUT/$name.perf.md"
}

# KEEP=1 keeps the runs of other points from an earlier run in $OUT (the
# points run now replace theirs).
if [[ ${KEEP:-0} == 1 && -f $OUT/runs.jsonl ]]; then
    python3 - "$OUT/runs.jsonl" "$MODELS" "$LENGTHS" <<'EOF'
import json, sys
path, models, lengths = sys.argv[1], sys.argv[2].split(), {int(x) for x in sys.argv[3].split()}
runs = [json.loads(l) for l in open(path)]
kept = [r for r in runs if not (r["model"] in models and r["target"] in lengths)]
open(path, "w").writelines(json.dumps(r) + "\n" for r in kept)
EOF
else
    : >"$OUT/runs.jsonl"
fi
for m in $MODELS; do
    for len in $LENGTHS; do
        args=(--gguf "$(gguf "$m")" --profile "$(profile "$m")" --weights auto
              --prompt-tokens "$len" --max-tokens 1 --prompt-out "$OUT/$m-$len.txt")
        for _ in $(seq 1 "$RUNS"); do
            if [[ " $SKIP " != *" $m:$len "* ]]; then
                step "$BENCH" "${args[@]}" --runs 1
                tag "$OUT/last.txt" seeker "$m" "$len" >>"$OUT/runs.jsonl"
            else
                # the prompt text only, for llama.cpp
                step "$BENCH" "${args[@]}" --runs 0
            fi
            step "$LLAMA_PY" bench/llama_cpp_bench.py "$OUT/$m-$len.txt" --gguf "$(gguf "$m")" \
                --max-tokens 1 --runs 1 --ctx $((len * 5 / 4 + 256))
            tag "$OUT/last.txt" llama.cpp "$m" "$len" >>"$OUT/runs.jsonl"
        done
        if [[ " $PERF " == *" $m:$len "* ]]; then
            perf_run "$m-$len-prefill" prefill 49 "${args[@]}" --runs 1
        fi
    done
    if [[ " $PERF_DECODE " == *" $m "* ]]; then
        # as `seeker serve` runs: the prefix cache on, so seeker's sentinel
        # logits processor runs at every step
        perf_run "$m-decode" decode 199 --gguf "$(gguf "$m")" --profile "$(profile "$m")" \
            --weights auto --prefix-cache --prompt-tokens 500 --max-tokens 64 --runs 6 \
            --prompt-out "$OUT/$m-decode.txt"
    fi
done

python3 - "$OUT" <<'EOF'
import json, statistics, sys
out = sys.argv[1]
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
med = statistics.median
print("| model | prompt tokens | seeker prefill tok/s | seeker time to first token s | llama.cpp prefill tok/s | seeker / llama.cpp | seeker tok/s / its shortest | llama.cpp tok/s / its shortest |")
print("|---|---|---|---|---|---|---|---|")
for model in dict.fromkeys(r["model"] for r in runs):
    base = {}
    for target in sorted({r["target"] for r in runs if r["model"] == model}):
        point = {}
        for engine in ["seeker", "llama.cpp"]:
            rs = [r for r in runs if r["model"] == model and r["target"] == target and r["engine"] == engine]
            if rs:
                point[engine] = (med([r["prefill_tok_s"] for r in rs]), med([r["prefill_s"] for r in rs]), rs[0]["prompt_tokens"])
                base.setdefault(engine, point[engine][0])
        s, l = point.get("seeker"), point.get("llama.cpp")
        tokens = (s or l)[2]
        cell = lambda x, f: f.format(x) if x is not None else "not run"
        print(f"| {model} | {tokens} | {cell(s and s[0], '{:.0f}')} | {cell(s and s[1], '{:.1f}')} | "
              f"{cell(l and l[0], '{:.0f}')} | {cell(s and l and s[0] / l[0], '{:.2f}')} | "
              f"{cell(s and s[0] / base['seeker'], '{:.2f}')} | {cell(l and l[0] / base['llama.cpp'], '{:.2f}')} |")
print(f"\n(medians of the runs in {out}/runs.jsonl; seeker with weights = \"auto\")")
EOF
for f in "$OUT"/*.perf.md; do
    [[ -f $f ]] || continue
    echo
    echo "### $(basename "$f" .perf.md)"
    cat "$f"
done
