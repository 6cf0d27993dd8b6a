#!/usr/bin/env python3
"""The loop a policy's authors write around an engine, for comparison with
seeker: for each question, one after another, search the question with bm25s
(top 3), put the documents before Search-R1's instruction in the user message
(seeker's `search-r1-prefetch` protocol, byte for byte), apply the chat template
(the server's `POST /apply-template`), then one `POST /v1/completions` to a
llama.cpp server (greedy, stop at `</answer>`). Prints one JSON line:
questions, seconds per question (mean, p50), and each answer.

usage: reference_loop.py QUESTIONS.jsonl CORPUS.jsonl URL [--max-tokens 256]
QUESTIONS.jsonl: one {"question": ...} per line (a `seeker eval --out` file).
Needs: python3 -m pip install bm25s==0.3.16 PyStemmer==3.1.0
"""
import argparse
import json
import statistics
import time
import urllib.request

import bm25s
import Stemmer

INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> "
    "first every time you get new information. After reasoning, if you find you lack some "
    "knowledge, you can call a search engine by <search> query </search> and it will "
    "return the top searched results between <information> and </information>. You can "
    "search as many times as your want. If you find no further external knowledge needed, "
    "you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)


def post(url, body):
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request) as response:
        return json.load(response)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("questions")
    ap.add_argument("corpus")
    ap.add_argument("url")
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args()

    docs = [json.loads(line) for line in open(args.corpus, encoding="utf-8")]
    stemmer = Stemmer.Stemmer("english")
    retriever = bm25s.BM25()
    retriever.index(
        bm25s.tokenize(
            [d["title"] + " " + d["text"] for d in docs],
            stopwords="en",
            stemmer=stemmer,
            show_progress=False,
        ),
        show_progress=False,
    )
    questions = [json.loads(line)["question"] for line in open(args.questions)]
    seconds, answers, prompt_tokens, generated = [], [], [], []
    for question in questions:
        started = time.perf_counter()
        q = question.strip()
        if not q.endswith("?"):
            q += "?"
        hits, _ = retriever.retrieve(
            bm25s.tokenize([q], stopwords="en", stemmer=stemmer, show_progress=False),
            k=3,
            show_progress=False,
        )
        block = "".join(
            f'Doc {i + 1}(Title: "{docs[j]["title"]}") {docs[j]["text"]}\n'
            for i, j in enumerate(hits[0])
        ).strip()
        user = f"<information>{block}</information>\n" + INSTRUCTION.format(question=q)
        prompt = post(
            args.url + "/apply-template", {"messages": [{"role": "user", "content": user}]}
        )["prompt"]
        response = post(
            args.url + "/v1/completions",
            {
                "prompt": prompt,
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "stop": ["</answer>"],
            },
        )
        seconds.append(time.perf_counter() - started)
        answers.append(response["choices"][0]["text"])
        prompt_tokens.append(response["usage"]["prompt_tokens"])
        generated.append(response["usage"]["completion_tokens"])
    print(
        json.dumps(
            {
                "engine": "reference loop (bm25s + llama.cpp)",
                "questions": len(questions),
                "seconds_mean": statistics.mean(seconds),
                "seconds_p50": statistics.median(seconds),
                "prompt_tokens_mean": statistics.mean(prompt_tokens),
                "generated_tokens_mean": statistics.mean(generated),
                "answers": answers,
            }
        )
    )


if __name__ == "__main__":
    main()
