#!/usr/bin/env bash
# API contract tests, as a client sees the server:
# 1. the official `openai` Python client (tests/python/test_openai_client.py);
# 2. schemathesis against /openapi.json: no 5xx, every status, content type,
#    header and body as the spec says.
# Both run against `cargo run --example api_server` (the real HTTP server with
# a scripted policy, so hundreds of requests take seconds) with an API key set.
# Installs the pinned Python packages in target/api-venv. Needs the default
# data and index (scripts/fetch-defaults.sh, run here, fetches and builds them).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=target/api-venv
if [ ! -x "$VENV/bin/schemathesis" ] || ! cmp -s tests/python/requirements.txt "$VENV/requirements.txt"; then
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q -r tests/python/requirements.txt
    cp tests/python/requirements.txt "$VENV/requirements.txt"
fi

# The debug build shares the test build's optimised dependencies.
cargo build --locked -q --bin seeker --example api_server
SEEKER_BIN=target/debug/seeker scripts/fetch-defaults.sh
KEY="sk-api-test-$RANDOM"
LOG=$(mktemp)
target/debug/examples/api_server --port 0 --api-key "$KEY" >"$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; rm -f "$LOG"' EXIT
for _ in $(seq 1 100); do
    grep -q "listening on" "$LOG" && break
    kill -0 $SERVER 2>/dev/null || { cat "$LOG"; exit 1; }
    sleep 0.1
done
URL=$(sed -n 's/^seeker listening on //p' "$LOG")
[ -n "$URL" ] || { echo "the API test server did not start:"; cat "$LOG"; exit 1; }
echo "API test server at $URL"

SEEKER_URL="$URL" SEEKER_KEY="$KEY" "$VENV/bin/python" -m pytest -q tests/python

# Every check; positive_data_acceptance is left out because the spec cannot
# say which valid-looking requests name a known policy or backend.
"$VENV/bin/schemathesis" run "$URL/openapi.json" \
    --header "Authorization: Bearer $KEY" \
    --checks all --exclude-checks positive_data_acceptance \
    --max-examples 200 --workers 2 --suppress-health-check all \
    --request-timeout 30
