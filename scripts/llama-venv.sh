#!/usr/bin/env bash
# Installs the pinned xllamacpp wheel (a prebuilt llama.cpp server, CPU) into
# target/llama-venv for the remote-engine tests and benchmark; idempotent.
# Prints the venv's python.
set -euo pipefail
exec "$(dirname "$0")/pinned-venv.sh" target/llama-venv tests/python/llama-requirements.txt
