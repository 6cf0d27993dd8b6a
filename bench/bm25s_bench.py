#!/usr/bin/env python3
"""The Python BM25 a user might pick instead of seeker's tantivy index: bm25s
(with PyStemmer's English stemmer and English stop words), on the same corpus
and queries as `search_bench tantivy`. Prints one JSON line like it.

usage: bm25s_bench.py CORPUS.jsonl QUERIES.txt INDEX_DIR [--k 3]
Needs: python3 -m pip install bm25s PyStemmer
"""
import argparse
import json
import os
import time

import bm25s
import Stemmer

ap = argparse.ArgumentParser()
ap.add_argument("corpus")
ap.add_argument("queries")
ap.add_argument("index")
ap.add_argument("--k", type=int, default=3)
args = ap.parse_args()

stemmer = Stemmer.Stemmer("english")
started = time.perf_counter()
texts, nbytes = [], 0
with open(args.corpus, encoding="utf-8") as f:
    for line in f:
        nbytes += len(line.encode("utf-8"))
        d = json.loads(line)
        texts.append(d["title"] + " " + d["text"])
tokens = bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False)
retriever = bm25s.BM25()
retriever.index(tokens, show_progress=False)
build_s = time.perf_counter() - started
retriever.save(args.index)
index_bytes = sum(
    os.path.getsize(os.path.join(args.index, n)) for n in os.listdir(args.index)
)
del texts, tokens

queries = [l.strip() for l in open(args.queries, encoding="utf-8") if l.strip()]


def search(batch, n_threads):
    q = bm25s.tokenize(batch, stopwords="en", stemmer=stemmer, show_progress=False)
    return retriever.retrieve(q, k=args.k, n_threads=n_threads, show_progress=False)


for q in queries[:20]:
    search([q], 1)
latencies = []
for q in queries:
    t = time.perf_counter()
    search([q], 1)
    latencies.append(time.perf_counter() - t)
latencies.sort()
threads = os.cpu_count() or 2
rounds = 3
t = time.perf_counter()
for _ in range(rounds):
    search(queries, threads)
qps = len(queries) * rounds / (time.perf_counter() - t)


def pct(p):
    return latencies[round((len(latencies) - 1) * p)]


print(json.dumps({
    "engine": "bm25s " + bm25s.__version__, "documents": retriever.scores["num_docs"],
    "corpus_bytes": nbytes, "build_s": build_s, "index_bytes": index_bytes,
    "queries": len(queries), "k": args.k,
    "p50_ms": pct(0.5) * 1e3, "p99_ms": pct(0.99) * 1e3,
    "threads": threads, "qps": qps,
}))
