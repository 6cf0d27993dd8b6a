#!/usr/bin/env python3
"""Reference numbers from llama.cpp on the same GGUF and prompt text.

Usage: PY bench/llama_cpp_bench.py PROMPT_FILE [--gguf PATH] [--max-tokens N] [--runs N] [--ctx N]
PY is the Python of target/llama-venv (`scripts/llama-venv.sh` prints it): llama.cpp's
server from the pinned `xllamacpp` wheel, prebuilt, run in this process with 2 threads
and one slot. The prompt file is what `cargo run --example engine_bench` writes. Each
run is a greedy `/completion` with `cache_prompt: false` (the whole prompt prefilled
again); prefill and decode speed are llama.cpp's own `timings` (`prompt_per_second`,
`predicted_per_second`). Prints one JSON object per run with the same fields as
engine_bench, and the greedy continuation of the first run.
"""
import argparse
import json
import urllib.request

import xllamacpp

ap = argparse.ArgumentParser()
ap.add_argument("prompt_file")
ap.add_argument("--gguf", default="models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
ap.add_argument("--max-tokens", type=int, default=64)
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--ctx", type=int, default=4096, help="context size (prompt + new tokens)")
args = ap.parse_args()

params = xllamacpp.CommonParams()
params.model.path = args.gguf
params.hostnames = ["127.0.0.1"]
params.port = 0
params.n_ctx = args.ctx
params.n_parallel = 1
params.n_batch = 512
params.cpuparams.n_threads = args.threads
params.cpuparams_batch.n_threads = args.threads
server = xllamacpp.Server(params)
url = server.listening_address.rstrip("/")

prompt = open(args.prompt_file, encoding="utf-8").read()
for run in range(args.runs):
    body = json.dumps({
        "prompt": prompt, "n_predict": args.max_tokens, "temperature": 0, "top_k": 1,
        "cache_prompt": False, "stream": False,
    }).encode()
    req = urllib.request.Request(f"{url}/completion", data=body,
                                 headers={"Content-Type": "application/json"})
    answer = json.load(urllib.request.urlopen(req))
    t = answer["timings"]
    print(json.dumps({
        "run": run, "prompt_tokens": t["prompt_n"], "prefill_s": t["prompt_ms"] / 1000,
        "prefill_tok_s": t["prompt_per_second"],
        "decode_tokens": t["predicted_n"], "decode_tok_s": t["predicted_per_second"],
    }), flush=True)
    if run == 0:
        print(json.dumps({"text": answer["content"]}), flush=True)
