#!/usr/bin/env python3
"""Turns one PhantomWiki universe (pw-generate's JSON output) into seeker's files.

    convert.py RAW_DIR OUT_DIR SEED SIZE

RAW_DIR holds what `pw-generate --article-format json --question-format json` wrote:
  articles.json   [{"title", "article" (markdown), "facts"}]
  questions.json  [{"id", "question", "answer" [list], "solution_traces" (JSON text),
                    "prolog" {"query": [...], "answer": "Y_2"}, "template" [words],
                    "type", "difficulty", "is_aggregation_question"}]

OUT_DIR gets:
  corpus.jsonl     {"id", "title", "text"} per article, in the generator's order; the
                   text is the article without its markdown headings, one line.
  questions.jsonl  {"id", "question", "answers", "answer_is_set": true, "difficulty",
                   "template", "type", "aggregation", "support", "prolog"} per question;
                   `support` lists the articles the solution passes through (below).

Both files are byte-for-byte reproducible for a seed: the generator's question ids are
random (uuid4) and the key order inside its solution traces follows Python's string
hashing, so ids here are the question's position (`pw{SEED}-{SIZE}-{n:03}`) and traces
are only read as sets.

Supporting articles: every person the query names ("Jeanette Byrd" in
`husband("Jeanette Byrd", Y_2)`) and every person a solution trace binds to a variable
other than the answer's; when that leaves none (`job(Y_2, "podiatrist")`: only the
answers themselves), the answers' articles. Relations the generator derives (uncle,
grandparent, cousin, in-laws) pass through people no trace names, so for those the list
is a lower bound of what a reader must open.
"""

import hashlib
import json
import re
import sys

QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def article_text(markdown: str) -> str:
    """The article's sentences on one line, headings dropped."""
    lines = [l.strip() for l in markdown.splitlines()]
    return " ".join(l for l in lines if l and not l.startswith("#"))


def support(question: dict, titles: set) -> list:
    answer_var = question["prolog"]["answer"]
    named = set()
    for atom in question["prolog"]["query"]:
        named.update(m for m in QUOTED.findall(atom) if m in titles)
    traces = json.loads(question.get("solution_traces") or "[]")
    answers = set()
    for trace in traces:
        for var, value in trace.items():
            if not isinstance(value, str) or value not in titles:
                continue
            (answers if var == answer_var else named).add(value)
    if not named:
        named = answers or {a for a in question["answer"] if a in titles}
    return sorted(named)


def main() -> None:
    raw, out, seed, size = sys.argv[1:]
    with open(f"{raw}/articles.json", encoding="utf-8") as f:
        articles = json.load(f)
    with open(f"{raw}/questions.json", encoding="utf-8") as f:
        questions = json.load(f)
    titles = {a["title"] for a in articles}
    with open(f"{out}/corpus.jsonl.tmp", "w", encoding="utf-8", newline="\n") as f:
        for n, a in enumerate(articles):
            doc = {"id": str(n), "title": a["title"], "text": article_text(a["article"])}
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
    with open(f"{out}/questions.jsonl.tmp", "w", encoding="utf-8", newline="\n") as f:
        for n, q in enumerate(questions):
            item = {
                "id": f"pw{seed}-{size}-{n:03}",
                "question": q["question"],
                "answers": [str(a) for a in q["answer"]],
                "answer_is_set": True,
                "difficulty": q["difficulty"],
                "template": " ".join(q["template"]),
                "type": q["type"],
                "aggregation": bool(q["is_aggregation_question"]),
                "support": support(q, titles),
                "prolog": q["prolog"],
            }
            f.write(json.dumps(item, ensure_ascii=False) + "\n")
    sums = {}
    for name in ("corpus.jsonl", "questions.jsonl"):
        with open(f"{out}/{name}.tmp", "rb") as f:
            sums[name] = hashlib.sha256(f.read()).hexdigest()
    print(json.dumps({"articles": len(articles), "questions": len(questions), "sha256": sums}))


if __name__ == "__main__":
    main()
