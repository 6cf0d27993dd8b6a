#!/usr/bin/env python3
"""Data for the search benchmark (bench/search.sh); nothing it writes is committed.

usage: make_search_data.py queries DEV_JSON OUT.txt
       make_search_data.py synthetic CORPUS.jsonl N OUT.jsonl

queries:   FanOutQA dev sub-questions of 5 to 15 words (the length of the queries
           search policies write), de-duplicated, in file order, one per line.
synthetic: N passages of 100 words drawn from the unigram distribution of the
           given corpus (Zipf-like, real vocabulary), titles of 2-4 words; seeded,
           so the same N gives the same file. {"id", "title", "text"} per line.
"""
import collections
import json
import re
import sys


def queries(dev, out):
    seen, lines = set(), []
    for q in json.load(open(dev, encoding="utf-8")):
        for sub in q.get("decomposition", []):
            text = " ".join(sub["question"].split())
            if 5 <= len(text.split()) <= 15 and text not in seen:
                seen.add(text)
                lines.append(text)
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(lines)} queries -> {out}")


def synthetic(corpus, n, out):
    counts = collections.Counter()
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            counts.update(re.findall(r"\w+", d["title"] + " " + d["text"]))
    import numpy as np  # installed with bm25s

    words = np.array(list(counts), dtype=object)
    p = np.array([counts[w] for w in words], dtype=np.float64)
    p /= p.sum()
    rng = np.random.default_rng(0)
    chunk = 10_000
    with open(out, "w", encoding="utf-8") as f:
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            body = words[rng.choice(len(words), size=(m, 104), p=p)]
            title_len = rng.integers(2, 5, size=m)
            for j in range(m):
                row = body[j]
                f.write(json.dumps({
                    "id": str(start + j),
                    "title": " ".join(row[:title_len[j]]),
                    "text": " ".join(row[4:]),
                }) + "\n")
    print(f"{n} passages from a {len(words)}-word vocabulary -> {out}")


if __name__ == "__main__":
    if sys.argv[1] == "queries":
        queries(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "synthetic":
        synthetic(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        sys.exit(__doc__)
