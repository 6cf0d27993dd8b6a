#!/usr/bin/env python3
"""Reference numbers from llama.cpp (llama-cpp-python) on the same GGUF and prompt text.

Usage: python3 bench/llama_cpp_bench.py PROMPT_FILE [--gguf PATH] [--max-tokens N] [--runs N]
The prompt file is what `cargo run --example engine_bench` writes
(target/engine_bench_prompt.txt). Prints one JSON object per run with the same fields
as engine_bench, and the greedy continuation of the first run.
Needs `python3 -m pip install llama-cpp-python==0.3.36` (builds from source here).
"""
import argparse
import json
import time

from llama_cpp import Llama

ap = argparse.ArgumentParser()
ap.add_argument("prompt_file")
ap.add_argument("--gguf", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
ap.add_argument("--max-tokens", type=int, default=64)
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()

llm = Llama(model_path=args.gguf, n_ctx=4096, n_threads=args.threads, n_batch=512, verbose=False)
prompt = open(args.prompt_file, encoding="utf-8").read()
ids = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
for run in range(args.runs):
    llm.reset()
    start = time.perf_counter()
    first = None
    out = []
    for tok in llm.generate(ids, top_k=1, temp=0.0, reset=True):
        if first is None:
            first = time.perf_counter()
        if tok == llm.token_eos() or len(out) >= args.max_tokens:
            break
        out.append(tok)
    end = time.perf_counter()
    n = len(out)
    print(json.dumps({
        "run": run, "prompt_tokens": len(ids), "prefill_s": first - start,
        "prefill_tok_s": len(ids) / (first - start),
        "decode_tokens": max(n - 1, 0), "decode_tok_s": max(n - 1, 0) / (end - first),
    }))
    if run == 0:
        print(json.dumps({"text": llm.detokenize(out).decode("utf-8", "replace")}))
