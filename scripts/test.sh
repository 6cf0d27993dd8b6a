#!/usr/bin/env bash
# Runs seeker's tests on a fresh machine (Debian or Ubuntu):
# 1. fetches the default model, corpus and FanOutQA (scripts/fetch-defaults.sh), and
#    generates the small PhantomWiki universe (scripts/phantomwiki.sh --size 500);
# 2. installs Debian's `searx` package if `searx-run` is missing: the SearXNG
#    backend test runs a real, offline searx over the default corpus;
# 3. installs the pinned `xllamacpp` wheel (a prebuilt llama.cpp server) into
#    target/llama-venv (scripts/llama-venv.sh): the remote-engine tests run
#    real llama.cpp servers;
# 4. runs `cargo test --locked` with any extra arguments given;
# 5. without arguments, also the API contract tests (scripts/api-tests.sh:
#    the official `openai` Python client, the web UI in headless Chromium and
#    schemathesis, in a virtualenv; it installs Debian's `chromium` and
#    `chromium-driver` if they are missing, as searx is installed here).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/fetch-defaults.sh --no-index
# The PhantomWiki universe of tests/it/phantomwiki.rs (seed 1, ~500 articles): installs
# SWI-Prolog (Debian swi-prolog-nox) and the pinned generator into target/phantomwiki-venv.
scripts/phantomwiki.sh --size 500 --no-index

if ! command -v searx-run >/dev/null 2>&1; then
    echo "installing Debian's searx package (for the SearXNG backend test)"
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends searx
    elif command -v sudo >/dev/null 2>&1; then
        sudo apt-get update -qq
        sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends searx
    else
        echo "error: searx-run is missing and this user cannot install packages;" >&2
        echo "       run: apt-get install -y --no-install-recommends searx" >&2
        exit 1
    fi
fi

SEEKER_LLAMA_PYTHON=$(scripts/llama-venv.sh)
export SEEKER_LLAMA_PYTHON

cargo test --locked "$@"

if [ $# -eq 0 ]; then
    scripts/api-tests.sh
fi
