#!/usr/bin/env python3
"""The table of bench/phantomwiki.sh: one row per policy x backend from the
`seeker eval` summaries in OUT (POLICY.BACKEND.summary.json), in the order of
POLICY arguments (every summary when none is given).

    phantomwiki_table.py OUT [POLICY ...]

Columns: questions; set F1 (PhantomWiki's score, arXiv 2502.20377) over all
and by difficulty (hops); EM over the single-answer questions; the share of
questions the model searched itself; searches a question; support recall (the
share of the question's supporting articles its own searches retrieved);
answer recall of the spliced documents; seconds a question (mean).
"""

import glob
import json
import os
import sys


def fmt(v, digits=3):
    return "–" if v is None else f"{v:.{digits}f}"


def main() -> None:
    out, *policies = sys.argv[1:]
    summaries = {}
    for path in sorted(glob.glob(os.path.join(out, "*.summary.json"))):
        policy, backend = os.path.basename(path)[: -len(".summary.json")].rsplit(".", 1)
        with open(path) as f:
            summaries[(policy, backend)] = json.load(f)
    order = policies or sorted({p for p, _ in summaries})
    hops = sorted({int(g["key"]) for s in summaries.values() for g in s["by_difficulty"]})
    head = (["policy", "backend", "questions", "set F1"] + [f"F1 {h} hop" + ("s" if h > 1 else "") for h in hops]
            + ["EM (single)", "searched", "searches / q", "support recall", "answer in docs", "s / q"])
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for policy in order:
        for (p, backend), s in summaries.items():
            if p != policy:
                continue
            by = {int(g["key"]): g for g in s["by_difficulty"]}
            row = [policy, "none" if backend == "none" else backend, str(s["questions"]), fmt(s["set_f1"])]
            row += [fmt(by.get(h, {}).get("set_f1")) for h in hops]
            row += [
                fmt(s["em"], 2),
                fmt(s["searched"], 2),
                fmt(s["searches_per_question"], 2),
                fmt(s["support_recall"], 2),
                fmt(s["answer_recall"], 2),
                fmt(s["seconds_per_question"]["mean"], 1),
            ]
            fails = sum(s["failures"].values())
            if fails:
                row[2] += f" ({fails} failed)"
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
