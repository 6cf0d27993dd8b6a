#!/usr/bin/env bash
# Usage: scripts/pinned-venv.sh VENV REQUIREMENTS
# Installs REQUIREMENTS (pinned, `--require-hashes`) into the virtualenv VENV (relative to
# the repository root), again only when the file changed since the last install, and
# prints the venv's python. Where `python3 -m venv` is missing (Debian without
# python3-venv), installs with `pip --target` and prints a wrapper that puts it on
# PYTHONPATH. Shared by scripts/llama-venv.sh and scripts/hf-from-gguf.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$1
REQ=$2
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
