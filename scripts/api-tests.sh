#!/usr/bin/env bash
# API contract tests, as a client sees the server:
# 1. the official `openai` and `mcp` Python clients (tests/python/test_*.py:
#    chat completions, citations, the Responses API, MCP);
# 2. the web UI in headless Chromium through Selenium (tests/python/test_web_ui.py;
#    a screenshot of a finished rollout lands in target/ui-artifacts/), and
#    `seeker report`'s page opened offline (tests/python/test_eval_report.py);
# 3. schemathesis against /openapi.json: no 5xx, every status, content type,
#    header and body as the spec says.
# All run against `cargo run --example api_server` (the real HTTP server with
# a scripted policy, so hundreds of requests take seconds) with an API key set.
# Then the same clients run against the real binary on the default model
# (tests/python/real_model: one question through the Responses API and MCP;
# a few minutes on a CPU).
# Installs the pinned Python packages in target/api-venv (a virtualenv, or a
# package directory when python3 has no venv module), and Debian's chromium and
# chromium-driver when chromedriver is missing. Needs the default data and
# index (scripts/fetch-defaults.sh, run here, fetches and builds them).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    echo "installing Debian's chromium and chromium-driver (for the web UI tests)"
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver
    elif command -v sudo >/dev/null 2>&1; then
        sudo apt-get update -qq
        sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver
    else
        echo "error: chromium or chromedriver is missing and this user cannot install packages;" >&2
        echo "       run: apt-get install -y --no-install-recommends chromium chromium-driver" >&2
        exit 1
    fi
fi

VENV=target/api-venv
# A virtualenv when python3 can make one; otherwise (no venv/ensurepip module)
# the packages go to a private directory on PYTHONPATH.
if [ ! -f "$VENV/requirements.txt" ] || ! cmp -s tests/python/requirements.txt "$VENV/requirements.txt"; then
    rm -rf "$VENV"
    if python3 -m venv "$VENV" 2>/dev/null && [ -x "$VENV/bin/python" ]; then
        "$VENV/bin/python" -m pip install -q -r tests/python/requirements.txt
    else
        rm -rf "$VENV"
        mkdir -p "$VENV"
        python3 -m pip install -q --target "$VENV/lib" -r tests/python/requirements.txt
    fi
    cp tests/python/requirements.txt "$VENV/requirements.txt"
fi
if [ -x "$VENV/bin/python" ]; then
    PY="$VENV/bin/python"
else
    PY=python3
    export PYTHONPATH="$PWD/$VENV/lib${PYTHONPATH:+:$PYTHONPATH}"
fi

# The debug build shares the test build's optimised dependencies.
cargo build --locked -q --bin seeker --example api_server
BUILT=${CARGO_TARGET_DIR:-target}/debug
SEEKER_BIN=$BUILT/seeker scripts/fetch-defaults.sh
KEY="sk-api-test-$RANDOM"

# announced LOG PID SECONDS: the address a server started with `--port 0`
# prints (`seeker listening on URL`), waiting up to SECONDS; exits with the
# log if the server dies or says nothing.
announced() {
    local log=$1 pid=$2 tries=$(($3 * 10))
    for _ in $(seq 1 "$tries"); do
        grep -q "listening on" "$log" && break
        kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
        sleep 0.1
    done
    local url
    url=$(sed -n 's/^seeker listening on //p' "$log")
    [ -n "$url" ] || { echo "the server did not start:" >&2; cat "$log" >&2; exit 1; }
    echo "$url"
}

LOG=$(mktemp)
"$BUILT/examples/api_server" --port 0 --api-key "$KEY" >"$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; rm -f "$LOG"' EXIT
URL=$(announced "$LOG" $SERVER 10)
echo "API test server at $URL"

SEEKER_URL="$URL" SEEKER_KEY="$KEY" SEEKER_BIN="$BUILT/seeker" "$PY" -m pytest -q -p no:cacheprovider tests/python \
    --ignore=tests/python/real_model

# Every check; positive_data_acceptance is left out because the spec cannot
# say which valid-looking requests name a known policy or backend.
"$PY" -m schemathesis.cli run "$URL/openapi.json" \
    --header "Authorization: Bearer $KEY" \
    --checks all --exclude-checks positive_data_acceptance \
    --max-examples 200 --workers 2 --suppress-health-check all \
    --request-timeout 30

# The real binary on the default config and model, with the same key.
kill $SERVER 2>/dev/null || true
REAL_LOG=$(mktemp)
SEEKER_API_KEYS="$KEY" "$BUILT/seeker" serve --host 127.0.0.1 --port 0 >"$REAL_LOG" 2>&1 &
REAL=$!
trap 'kill $REAL 2>/dev/null || true; rm -f "$LOG" "$REAL_LOG"' EXIT
REAL_URL=$(announced "$REAL_LOG" $REAL 300)
"$PY" - "$REAL_URL" <<'PY'
import sys, time, urllib.request, urllib.error
deadline = time.time() + 300
while True:
    try:
        with urllib.request.urlopen(sys.argv[1] + "/health") as r:
            if r.status == 200:
                break
    except (urllib.error.URLError, ConnectionError):
        pass
    if time.time() > deadline:
        sys.exit("the default model did not load within 300 s")
    time.sleep(0.5)
PY
echo "real server (default model) at $REAL_URL"
SEEKER_URL="$REAL_URL" SEEKER_KEY="$KEY" "$PY" -m pytest -q -p no:cacheprovider tests/python/real_model
