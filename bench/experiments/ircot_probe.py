"""IRCoT on PhantomWiki, probed outside seeker before the `ircot` profile existed.

Reproduces bench/README.md "IRCoT: every sentence a query": a small Python loop over a llama.cpp
server (the default GGUF) and seeker's `POST /retrieve` (a seeker server over the universe's
index) that runs
  - `rag`:      the question's top-k, then "So the answer is:" and the answer;
  - `rebuilt`:  IRCoT as its paper runs it (Trivedi et al., arXiv 2212.10509): every article
                found so far before the question, the chain of thought so far as the assistant's
                text, one sentence generated a step, that sentence the next query; at most
                STEPS sentences, then "So the answer is:" is forced;
  - `appended`: the same steps with the articles spliced right after each sentence (the rollout
                stays one growing text), which is what config/policies/ircot.toml does inside
                seeker, with the same system message.
Set F1 here is a plain re-implementation of PhantomWiki's (answers split on commas, normalised
as SQuAD does); seeker eval's numbers are the ones the tables use.

usage (servers: tests/python/llama_server.py MODEL --threads 2 --parallel 1 --ctx 8192, and
`SEEKER_MODEL__ENGINE=remote SEEKER_MODEL__REMOTE_URLS=LLAMA SEEKER_SEARCH__INDEX=INDEX
seeker serve`):
  python3 bench/experiments/ircot_probe.py QUESTIONS.jsonl LLAMA_URL SEEKER_URL \
      --mode rag|rebuilt|appended [--demo-turn] [--limit 20] [--out FILE]
`--demo-turn` puts a worked example in a user/assistant exchange before the question (the
`rebuilt` rows); without it `rebuilt` has no example, and `appended` carries its example in the
system message, as the profile does.
"""
import argparse
import json
import re
import string
import sys
import time
import urllib.request


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def norm(s):
    s = "".join(c for c in s.lower() if c not in string.punctuation)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def set_f1(pred, gold):
    p = {norm(x) for x in pred.split(",") if norm(x)}
    g = {norm(x) for x in gold}
    tp = len(p & g)
    if not tp:
        return 0.0
    precision, recall = tp / len(p), tp / len(g)
    return 2 * precision * recall / (precision + recall)


# The instruction and example of config/policies/ircot.toml (its system message).
INSTRUCTION = ("Answer the question using the articles. Think step by step: write one short "
               "sentence at a time, each stating one fact from the articles that leads toward the "
               "answer. After each sentence, articles about it are added. When you know the answer, "
               "write \"So the answer is: \" followed by the answer (names or values separated by "
               "commas).")
EXAMPLE = ("\n\nExample:\n\nArticle: \"Inception\" Inception is a 2010 science fiction film. The "
           "director of Inception is Christopher Nolan.\n\nQuestion: Who is the brother of the "
           "director of Inception?\n\nThe director of Inception is Christopher Nolan.\nArticle: "
           "\"Christopher Nolan\" Christopher Nolan is a film director. The wife of Christopher "
           "Nolan is Emma Thomas. The brothers of Christopher Nolan are Jonathan Nolan, Matthew "
           "Nolan.\nThe brothers of Christopher Nolan are Jonathan Nolan, Matthew Nolan.\nArticle: "
           "\"Jonathan Nolan\" Jonathan Nolan is a screenwriter. The brother of Jonathan Nolan is "
           "Christopher Nolan.\nSo the answer is: Jonathan Nolan, Matthew Nolan.")
DEMO_USER = ("Article: \"Inception\"\nInception is a 2010 science fiction film. The director of "
             "Inception is Christopher Nolan.\n\nArticle: \"Christopher Nolan\"\nChristopher Nolan "
             "is a film director. The wife of Christopher Nolan is Emma Thomas. The brothers of "
             "Christopher Nolan are Jonathan Nolan, Matthew Nolan.\n\nQuestion: Who is the brother "
             "of the director of Inception?")
DEMO_ASSISTANT = ("The director of Inception is Christopher Nolan. The brothers of Christopher "
                  "Nolan are Jonathan Nolan, Matthew Nolan. So the answer is: Jonathan Nolan, "
                  "Matthew Nolan.")


def chatml(system, user, assistant, demo):
    turns = (f"<|im_start|>user\n{DEMO_USER}<|im_end|>\n<|im_start|>assistant\n{DEMO_ASSISTANT}"
             "<|im_end|>\n") if demo else ""
    return (f"<|im_start|>system\n{system}<|im_end|>\n{turns}<|im_start|>user\n{user}<|im_end|>\n"
            f"<|im_start|>assistant\n{assistant}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("questions")
    ap.add_argument("llama")
    ap.add_argument("seeker")
    ap.add_argument("--mode", choices=["rag", "rebuilt", "appended"], required=True)
    ap.add_argument("--demo-turn", action="store_true")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--top-k", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    qs = [json.loads(line) for line in open(a.questions)]
    qs = [q for q in qs if q["difficulty"] <= 3 and not q["aggregation"]][: a.limit]
    out = open(a.out, "w") if a.out else None

    def retrieve(query):
        r = post(a.seeker + "/retrieve", {"queries": [query], "topk": a.top_k})
        return [d["document"]["contents"] if "document" in d else d["contents"] for d in r["result"][0]]

    def complete(prompt, stop, max_tokens=64):
        r = post(a.llama + "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens,
                                               "temperature": 0, "stop": stop})
        return r["choices"][0]["text"], r["choices"][0].get("finish_reason")

    def lines(docs):
        # "\"Title\"\ntext" as one `Article: "Title" text` line, as the profile splices it.
        return "".join("Article: " + " ".join(d.split("\n", 1)) + "\n" for d in docs)

    system = INSTRUCTION + (EXAMPLE if a.mode == "appended" else "")
    f1s = []
    for q in qs:
        started = time.time()
        queries, answer = [q["question"]], None
        docs = retrieve(q["question"])
        if a.mode == "appended":
            user, text = lines(docs) + f"\nQuestion: {q['question']}", ""
            for step in range(a.steps + 1):
                piece, finish = complete(chatml(system, user, text, a.demo_turn), [".", "<|im_end|>"])
                low = piece.lower()
                if "the answer is:" in low:
                    answer = piece[low.index("the answer is:") + len("the answer is:"):].strip(" :.\n")
                    text += piece + "."
                    break
                if step == a.steps or finish != "stop" or not piece.strip():
                    break
                text += piece + "."
                queries.append(piece.strip())
                text += "\n" + lines(retrieve(piece.strip()))
        else:
            seen, text = list(dict.fromkeys(docs)), ""
            for _ in range(a.steps if a.mode == "rebuilt" else 0):
                user = "\n\n".join("Article: " + d for d in seen) + f"\n\nQuestion: {q['question']}"
                piece, _ = complete(chatml(system, user, text, a.demo_turn), ["\n", "<|im_end|>"])
                m = re.match(r"\s*(.*?[.!?])(\s|$)", piece)
                sentence = m.group(1) if m else piece.strip()
                if not sentence:
                    break
                text += (" " if text else "") + sentence
                low = sentence.lower()
                if "answer is" in low:
                    answer = sentence[low.index("answer is") + len("answer is"):].strip(" :.")
                    break
                queries.append(sentence)
                seen.extend(d for d in retrieve(sentence) if d not in seen)
            if answer is None:
                user = "\n\n".join("Article: " + d for d in seen) + f"\n\nQuestion: {q['question']}"
                prefix = text + (" " if text else "") + "So the answer is:"
                piece, _ = complete(chatml(system, user, prefix, a.demo_turn), ["\n", "<|im_end|>"], 48)
                answer, text = piece.strip(" :."), prefix + " " + piece
        f1 = set_f1(answer or "", q["answers"])
        f1s.append(f1)
        row = {"id": q["id"], "difficulty": q["difficulty"], "answer": answer, "gold": q["answers"],
               "f1": f1, "queries": queries, "text": text, "s": round(time.time() - started, 1)}
        print(json.dumps(row), flush=True)
        if out:
            out.write(json.dumps(row) + "\n")
    print(f"{a.mode}: set F1 {sum(f1s) / len(f1s):.3f} over {len(f1s)} questions", file=sys.stderr)


main()
