#!/usr/bin/env bash
# Installs the pinned xllamacpp wheel (a prebuilt llama.cpp server, CPU) into
# target/llama-venv for the remote-engine tests and benchmark; idempotent.
# Prints the venv's python.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=target/llama-venv
REQ=tests/python/llama-requirements.txt
if [ ! -f "$VENV/requirements.txt" ] || ! cmp -s "$REQ" "$VENV/requirements.txt"; then
    rm -rf "$VENV"
    if python3 -m venv "$VENV" 2>/dev/null && [ -x "$VENV/bin/python" ]; then
        "$VENV/bin/python" -m pip install -q --require-hashes -r "$REQ" >&2
    else
        rm -rf "$VENV"
        mkdir -p "$VENV/bin"
        python3 -m pip install -q --require-hashes --target "$VENV/lib" -r "$REQ" >&2
        printf '#!/bin/sh\nPYTHONPATH="%s/lib${PYTHONPATH:+:$PYTHONPATH}" exec python3 "$@"\n' \
            "$PWD/$VENV" > "$VENV/bin/python"
        chmod +x "$VENV/bin/python"
    fi
    cp "$REQ" "$VENV/requirements.txt"
fi
echo "$PWD/$VENV/bin/python"
