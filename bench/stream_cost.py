#!/usr/bin/env python3
"""What streaming costs llama-server, for bench/README.md (issue 26): the same
greedy generation asked for three ways, alternating, against one server:

- `whole`: `stream: false`, one JSON answer (what the reference loop asks);
- `stream`: `stream: true`, read chunk by chunk;
- `seeker`: `stream: true` with what seeker's remote engine adds to every
  round (`src/engine/remote/request.rs`): `stream_options` with usage per
  chunk, `timings_per_token` and `logprobs: 1` (the generated ids);
- `usage`, `timings`, `logprobs`: `stream: true` with one of those three;
- `seeker-post`: `seeker` with `post_sampling_probs: true` (llama-server then
  reports the sampled token's probability among the candidates left after
  sampling instead of a softmax over the whole vocabulary; the token id comes
  the same way)
(`--modes` picks; the default is the first three).

Each request generates TOKENS tokens (`ignore_eos`) after a short prompt with
the prompt cache off, so every request does the same work. Prints one JSON
line per mode: wall milliseconds per generated token (mean and each run) and
the server's own `timings.predicted_per_token_ms`.

usage: stream_cost.py URL [--tokens 150] [--runs 4] [--modes whole,stream,seeker]
URL: a llama-server (e.g. `tests/python/llama_server.py MODEL --threads 2 --parallel 1`).
"""
import argparse
import json
import statistics
import time
import urllib.request

PROMPT = "Write a long story about a dragon."


def body(mode, tokens):
    b = {
        "prompt": PROMPT,
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "cache_prompt": False,
        "stream": mode != "whole",
    }
    if mode == "seeker-post":
        b["post_sampling_probs"] = True
    if mode in ("seeker", "seeker-post", "usage"):
        b["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if mode in ("seeker", "seeker-post", "timings"):
        b["timings_per_token"] = True
    if mode in ("seeker", "seeker-post", "logprobs"):
        b["logprobs"] = 1
    return b


def run(url, mode, tokens):
    request = urllib.request.Request(
        url + "/v1/completions",
        json.dumps(body(mode, tokens)).encode(),
        {"Content-Type": "application/json"},
    )
    started = time.perf_counter()
    timings = {}
    with urllib.request.urlopen(request) as response:
        if mode == "whole":
            timings = json.load(response).get("timings", {})
        else:
            for line in response:
                line = line.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                timings = chunk.get("timings", timings)
    wall = time.perf_counter() - started
    return wall * 1e3 / tokens, timings.get("predicted_per_token_ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--tokens", type=int, default=150)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--modes", default="whole,stream,seeker")
    args = ap.parse_args()
    modes = args.modes.split(",")
    run(args.url, "whole", 8)  # load the weights into the page cache
    wall = {m: [] for m in modes}
    server = {m: [] for m in modes}
    for i in range(args.runs):
        # Alternate the order so that no mode always follows the same one.
        for mode in modes[i % len(modes):] + modes[: i % len(modes)]:
            w, s = run(args.url, mode, args.tokens)
            wall[mode].append(w)
            server[mode].append(s)
    for mode in modes:
        print(
            json.dumps(
                {
                    "mode": mode,
                    "wall_ms_per_token": statistics.mean(wall[mode]),
                    "wall_runs": [round(w, 2) for w in wall[mode]],
                    "server_ms_per_token": statistics.mean(s for s in server[mode] if s)
                    if any(server[mode])
                    else None,
                }
            )
        )


if __name__ == "__main__":
    main()
