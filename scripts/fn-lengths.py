#!/usr/bin/env python3
"""Lists Rust functions longer than a bound (issue 29: none over 100 lines
outside tests and the metrics table).

A function's length runs from its `fn` line to its closing brace. Braces in
comments, string, raw-string and char literals are skipped; a file's code
ends at its first `#[cfg(test)]` line.

Usage: scripts/fn-lengths.py [--over N] [PATH ...]   (default: 100, src/)
Prints `LINES FILE:LINE NAME`, longest first.
"""
import argparse
import pathlib
import re

FN = re.compile(r"\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+(\w+)")
RAW_STRING = re.compile(r'b?r(#*)"')
CHAR = re.compile(r"'(?:\\.[^']*|[^'\\\n])'")


def blank(text):
    """`text` with every character but newlines replaced by a space."""
    return re.sub(r"[^\n]", " ", text)


def code_only(src):
    """`src` with comments and literals blanked out, line numbers kept."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
        elif (m := RAW_STRING.match(src, i)) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            end = '"' + m.group(1)
            j = src.find(end, m.end())
            j = n if j < 0 else j + len(end)
        elif src[i] == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j += 1
        elif src[i] == "'" and (m := CHAR.match(src, i)):
            j = m.end()
        else:
            out.append(src[i])
            i += 1
            continue
        out.append(blank(src[i:j]))
        i = j
    return "".join(out)


def lengths(path):
    """`(lines, line number, name)` of each function before the tests."""
    raw = path.read_text().split("\n")
    code = code_only("\n".join(raw)).split("\n")
    end = next((k for k, line in enumerate(raw) if line.startswith("#[cfg(test)]")), len(raw))
    for start in range(end):
        m = FN.match(raw[start])
        if not m:
            continue
        depth, opened = 0, False
        for k in range(start, len(code)):
            depth += code[k].count("{") - code[k].count("}")
            opened = opened or "{" in code[k]
            if opened and depth == 0:
                break
            if not opened and code[k].rstrip().endswith(";"):
                break
        yield k - start + 1, start + 1, m.group(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--over", type=int, default=100)
    parser.add_argument("paths", nargs="*", default=["src"])
    args = parser.parse_args()
    found = []
    for root in map(pathlib.Path, args.paths):
        for path in sorted([root] if root.is_file() else root.rglob("*.rs")):
            found += [(n, f"{path}:{line}", name) for n, line, name in lengths(path) if n > args.over]
    for n, where, name in sorted(found, reverse=True):
        print(n, where, name)


if __name__ == "__main__":
    main()
