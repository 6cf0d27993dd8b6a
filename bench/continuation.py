#!/usr/bin/env python3
"""Token-level continuation on and off, side by side (bench/README.md).

Starts two `seeker serve` on the default config, one with
`model.token_continuation = true` (the default) and one with it false (each
round's transcript text tokenized whole, as before), and asks both the same
FanOutQA dev sub-questions with the `search-r1` policy, alternating, one
request at a time. For every round after the first it reports what the round
read from the prefix cache against what the previous round read and wrote
(its prompt plus its generated tokens), and the tokens prefilled, per mode.

With --force-search the assistant turn is continued from `<search>` (the model
writes its query), so every question has at least two rounds; the default model
writes its own search for only some questions.

usage: bench/continuation.py [--bin target/release/seeker] [--questions 6] [--max-tokens 160] [--force-search]
Needs the default model and index (scripts/fetch-defaults.sh). Prints JSON
lines, then one summary line per mode.
"""
import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request


def start(binary, on):
    env = dict(os.environ, SEEKER_MODEL__TOKEN_CONTINUATION="true" if on else "false",
               RUST_LOG="warn,mistralrs_core::pipeline::gguf=error")
    proc = subprocess.Popen([binary, "serve", "--host", "127.0.0.1", "--port", "0"],
                            stdout=subprocess.PIPE, env=env, text=True)
    line = proc.stdout.readline().strip()
    prefix = "seeker listening on "
    if not line.startswith(prefix):
        proc.kill()
        sys.exit(f"unexpected first line: {line!r}")
    base = line[len(prefix):]
    deadline = time.time() + 600
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(base + "/health") as r:
                if r.status == 200:
                    return proc, base
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit("the model did not load within 600 s")


def ask(base, question, max_tokens, force):
    messages = [{"role": "user", "content": question}]
    if force:
        messages.append({"role": "assistant", "content": "<search>"})
    body = json.dumps({"policy": "search-r1", "max_tokens": max_tokens, "return_transcript": True,
                       "continue_final_message": force, "messages": messages}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    started = time.time()
    with urllib.request.urlopen(req, timeout=900) as r:
        answer = json.load(r)
    return answer, time.time() - started


def questions(n):
    dev = json.load(open("data/fanoutqa/dev.json", encoding="utf-8"))
    out = []
    for q in dev:
        for sub in q.get("decomposition", []):
            out.append(" ".join(sub["question"].split()))
            if len(out) == n:
                return out
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/seeker")
    ap.add_argument("--questions", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--force-search", action="store_true")
    args = ap.parse_args()
    servers = {on: start(args.bin, on) for on in (True, False)}
    totals = {on: {"rounds": 0, "cached": 0, "previous": 0, "prefilled": 0, "seconds": 0.0}
              for on in servers}
    try:
        for i, question in enumerate(questions(args.questions)):
            # Alternate which mode goes first.
            for on in ((True, False) if i % 2 == 0 else (False, True)):
                answer, seconds = ask(servers[on][1], question, args.max_tokens, args.force_search)
                rounds = [r for r in answer["seeker"]["rounds"] if "prompt_tokens" in r]
                t = totals[on]
                t["seconds"] += seconds
                for prev, cur in zip(rounds, rounds[1:]):
                    previous = prev["prompt_tokens"] + prev["tokens_generated"]
                    cached = cur.get("prompt_tokens_cached", 0)
                    t["rounds"] += 1
                    t["cached"] += cached
                    t["previous"] += previous
                    t["prefilled"] += cur["prompt_tokens"] - cached
                    print(json.dumps({"token_continuation": on, "question": i, "round": cur["round"],
                                      "previous_read_and_written": previous, "cached": cached,
                                      "prefilled": cur["prompt_tokens"] - cached}), flush=True)
                print(json.dumps({"token_continuation": on, "question": i, "seconds": round(seconds, 2),
                                  "rounds": len(rounds)}), flush=True)
    finally:
        for proc, _ in servers.values():
            proc.kill()
    for on, t in totals.items():
        print(json.dumps({"token_continuation": on, "later_rounds": t["rounds"],
                          "cached": t["cached"], "previous_read_and_written": t["previous"],
                          "missed": t["previous"] - t["cached"], "prefilled": t["prefilled"],
                          "seconds": round(t["seconds"], 1)}))


if __name__ == "__main__":
    main()
