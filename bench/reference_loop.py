#!/usr/bin/env python3
"""The loop a policy's authors write around an engine, for comparison with
seeker. Two protocols, byte for byte as seeker's profiles of the same name:

- `search-r1-prefetch` (default): for each question, search the question with
  bm25s (top 3), put the documents before Search-R1's instruction in the user
  message, apply the chat template (the server's `POST /apply-template`), then
  one `POST /v1/completions` (greedy, stop at `</answer>`).
- `search-r1` (`--policy search-r1`): Search-R1's own loop (`infer.py`): the
  instruction and question through the chat template, then rounds of `POST
  /v1/completions` (greedy, stop at `</search>` and `</answer>`); a round
  that ends in a search call gets the call's query searched with bm25s (top
  3) and `\n\n<information>Doc 1(Title: "...") ...</information>\n\n`
  appended to the prompt, which is sent again as text (the server's prompt
  cache reuses what it has seen); at most 4 searches; `--max-tokens` is the
  budget of all rounds together, as seeker's `max_tokens` is. With
  `--retriever URL` the queries go to a Search-R1 retrieval server (`POST
  URL/retrieve`, as Search-R1's infer.py sends them; seeker serves one over
  its own index), so the loop reads the same documents seeker splices.

One question after another. Prints one JSON line: questions, seconds per
question (mean, p50), prompt tokens per question (all rounds, as the server
counts them), tokens prefilled (not taken from the server's cache),
generated tokens, searches, and each answer.

usage: reference_loop.py QUESTIONS.jsonl CORPUS.jsonl URL [--max-tokens 256]
                         [--policy search-r1-prefetch|search-r1] [--retriever URL]
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
    ap.add_argument("--policy", choices=["search-r1-prefetch", "search-r1"], default="search-r1-prefetch")
    ap.add_argument("--retriever", help="search through this Search-R1 retrieval server "
                    "(POST URL/retrieve, as Search-R1's infer.py does) instead of bm25s")
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

    def search(query):
        if args.retriever:
            # Search-R1's infer.py: POST /retrieve, then `_passages2string`.
            result = post(args.retriever + "/retrieve", {"queries": [query], "topk": 3})
            block = ""
            for i, doc in enumerate(result["result"][0]):
                content = doc["document"]["contents"] if "document" in doc else doc["contents"]
                title, _, text = content.partition("\n")
                block += f"Doc {i + 1}(Title: {title}) {text}\n"
            return block.strip()
        hits, _ = retriever.retrieve(
            bm25s.tokenize([query], stopwords="en", stemmer=stemmer, show_progress=False),
            k=3,
            show_progress=False,
        )
        return "".join(
            f'Doc {i + 1}(Title: "{docs[j]["title"]}") {docs[j]["text"]}\n'
            for i, j in enumerate(hits[0])
        ).strip()

    def complete(prompt, max_tokens, stop):
        return post(
            args.url + "/v1/completions",
            {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stop": stop},
        )

    seconds, answers, prompt_tokens, prefilled, generated, searches = [], [], [], [], [], []
    for question in questions:
        started = time.perf_counter()
        q = question.strip()
        if not q.endswith("?"):
            q += "?"
        if args.policy == "search-r1-prefetch":
            user = f"<information>{search(q)}</information>\n" + INSTRUCTION.format(question=q)
        else:
            user = INSTRUCTION.format(question=q)
        prompt = post(
            args.url + "/apply-template", {"messages": [{"role": "user", "content": user}]}
        )["prompt"]
        read = fresh = wrote = calls = 0
        answer = ""
        while True:
            stop = ["</answer>"] if args.policy == "search-r1-prefetch" else ["</search>", "</answer>"]
            response = complete(prompt, max(args.max_tokens - wrote, 1), stop)
            usage, timings = response["usage"], response.get("timings", {})
            read += usage["prompt_tokens"]
            fresh += timings.get("prompt_n", usage["prompt_tokens"])
            wrote += usage["completion_tokens"]
            text = response["choices"][0]["text"]
            answer = text
            # llama-server drops the stop string it matched: a search call is
            # an opened `<search>` after the last `</search>` of the text.
            call = text.rfind("<search>")
            if (
                args.policy == "search-r1"
                and response["choices"][0]["finish_reason"] == "stop"
                and call > text.rfind("</answer>")
                and call > text.rfind("<answer>")
                and "</search>" not in text[call:]
                and calls < 4
                and wrote < args.max_tokens
            ):
                query = text[call + len("<search>"):].strip()
                calls += 1
                prompt += text + "</search>" + f"\n\n<information>{search(query)}</information>\n\n"
                continue
            break
        start = answer.find("<answer>")
        if start >= 0:
            answer = answer[start + len("<answer>"):]
        seconds.append(time.perf_counter() - started)
        answers.append(answer.strip())
        prompt_tokens.append(read)
        prefilled.append(fresh)
        generated.append(wrote)
        searches.append(calls)
    print(
        json.dumps(
            {
                "engine": f"reference loop (bm25s + llama.cpp), {args.policy}",
                "questions": len(questions),
                "seconds_mean": statistics.mean(seconds),
                "seconds_p50": statistics.median(seconds),
                "seconds": seconds,
                "prompt_tokens_mean": statistics.mean(prompt_tokens),
                "prompt_tokens": prompt_tokens,
                "prefilled_tokens": prefilled,
                "prefilled_tokens_mean": statistics.mean(prefilled),
                "generated_tokens_mean": statistics.mean(generated),
                "searches_mean": statistics.mean(searches),
                "answers": answers,
            }
        )
    )


if __name__ == "__main__":
    main()
