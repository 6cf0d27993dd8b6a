#!/usr/bin/env python3
"""The kernels check of issue 46: does the embedded engine on candle-core 0.11's kernels
compute what it computed on candle 0.10's, and what llama.cpp computes, on the same GGUF?

    kernels.py LLAMA_URL RUN.jsonl [RUN.jsonl ...]

Each RUN.jsonl is `logprob_probe kernels` output of one build (the first is the reference
the others are set against, e.g. the build before the change): one line per prompt with its
token ids, the top 10 next-token log-probs and 48 greedy tokens. llama.cpp (a running
llama-server on the same GGUF, e.g. tests/python/llama_server.py) is asked the same ids:
`n_probs` 10 of the unmodified distribution, then 48 greedy tokens, without its prompt cache.

Prints, per prompt and build: whether the greedy next token is llama.cpp's and the
reference's, the largest log-prob difference over llama.cpp's top 5 (and over the
reference's), and how many characters of the greedy continuation agree.
"""

import json
import sys
import urllib.request


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def llama(url, ids, tokens):
    probs = post(f"{url}/completion", {
        "prompt": ids, "n_predict": 1, "n_probs": 10, "temperature": 0,
        "cache_prompt": False, "post_sampling_probs": False,
    })["completion_probabilities"][0]["top_logprobs"]
    text = post(f"{url}/completion", {
        "prompt": ids, "n_predict": tokens, "temperature": 0, "cache_prompt": False,
    })["content"]
    return [(t["id"], t["logprob"]) for t in probs], text


def worst(ours, theirs, n=5):
    """Largest |log-prob difference| over `theirs`' top n (a token missing from
    `ours`' top 10 counts as infinite)."""
    mine = dict(ours)
    return max(abs(mine[i] - lp) if i in mine else float("inf") for i, lp in theirs[:n])


def agree(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main():
    url, *paths = sys.argv[1:]
    runs = [[json.loads(l) for l in open(p)] for p in paths]
    names = [p.rsplit("/", 1)[-1].removesuffix(".jsonl") for p in paths]
    print("| prompt | build | tokens | top-1 = llama.cpp's | top-1 = first build's | max Δ log-prob vs llama.cpp (top 5) | vs first build | greedy chars = llama.cpp's (of 48 tokens) | = first build's |")
    print("|---|---|---|---|---|---|---|---|---|")
    summary = {n: {"top1": 0, "worst": 0.0, "worst_ref": 0.0, "same_text": 0} for n in names}
    for i, ref in enumerate(runs[0]):
        theirs, text = llama(url, ref["ids"], 48)
        for name, run in zip(names, runs):
            row = run[i]
            assert row["ids"] == ref["ids"], f"{name}: another tokenization of {ref['name']}"
            top = [tuple(t) for t in row["top"]]
            reftop = [tuple(t) for t in ref["top"]]
            w = worst(top, theirs)
            wr = worst(top, reftop)
            same = agree(row["greedy"], text)
            s = summary[name]
            s["top1"] += top[0][0] == theirs[0][0]
            s["worst"] = max(s["worst"], w)
            s["worst_ref"] = max(s["worst_ref"], wr)
            s["same_text"] += row["greedy"] == text
            print(f"| {ref['name']} | {name} | {len(ref['ids'])} | {'yes' if top[0][0] == theirs[0][0] else 'NO'} | "
                  f"{'yes' if top[0][0] == reftop[0][0] else 'NO'} | {w:.3f} | {wr:.3f} | "
                  f"{same} of {len(text)} | {agree(row['greedy'], ref['greedy'])} of {len(ref['greedy'])} |")
    print()
    n = len(runs[0])
    for name, s in summary.items():
        print(f"{name}: greedy next token = llama.cpp's on {s['top1']} of {n} prompts; largest log-prob "
              f"difference over llama.cpp's top 5 {s['worst']:.3f}, over the first build's {s['worst_ref']:.3f}; "
              f"48-token greedy text identical to llama.cpp's on {s['same_text']} of {n}")


if __name__ == "__main__":
    main()
