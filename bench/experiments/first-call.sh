#!/usr/bin/env bash
# Reproduces bench/README.md "Make it better: a forced first search and names-only answers
# (tried, not kept)": seeker writes the opening of the first turn's search call, the prompt asks
# for names only. The code was not kept, so this applies it (first-call.diff: a `tools.first_call`
# profile flag read by `forced_opening` in src/rollout/prompt.rs, and a scripted-engine test),
# writes the variant's profile from tool-search.toml, builds, and runs it beside `rag` on the first
# LIMIT questions of seed 1 (5k). It changes the work tree: run it on a scratch clone.
#
# usage: bench/experiments/first-call.sh        (Env: LIMIT (20), SEED (1))
set -euo pipefail
cd "$(dirname "$0")/../.."
git apply bench/experiments/first-call.diff
python3 - <<'PY'
src = open("config/policies/tool-search.toml").read()
swaps = [
    ('name = "tool-search"', 'name = "tool-search-first-call"'),
    ('format = "chat"\nuser = "{question}"',
     'format = "system"\nsystem = "You are a helpful assistant. Search for what the question asks '
     'before you answer. Answer with the names or values only, separated by commas, and no other '
     'words."\nuser = "{question}"'),
    ('turn_prefix = "According to the search results,"',
     'turn_prefix = "According to the search results, the answer is"\nfirst_call = true'),
]
for old, new in swaps:
    assert src.count(old) == 1, old
    src = src.replace(old, new)
open("config/policies/tool-search-first-call.toml", "w").write(src)
PY
cargo build --locked -q --bin seeker
SEEKER_BIN=target/debug/seeker LIMIT=${LIMIT:-20} SEED=${SEED:-1} \
    OUT=target/bench-phantomwiki/first-call POLICIES="rag tool-search-first-call" BACKENDS=tantivy \
    bench/phantomwiki.sh
