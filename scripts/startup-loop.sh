#!/usr/bin/env bash
# The reproduction of issue 12 (a server that never answered after the model
# loaded): starts `seeker serve` N times, polls /health every 0.2 s for 4 s
# while the model loads, then asks once more with a 3 s limit and counts the
# starts that answered 200. Run from the repository root (config/, models/,
# data/ as scripts/fetch-defaults.sh leaves them).
#   scripts/startup-loop.sh [BINARY] [N] [FIRST_PORT]
# defaults: target/release/seeker, 50, 20200 (below the ephemeral port range,
# so no client connection can take a server's port).
set -u
bin=${1:-target/release/seeker}; n=${2:-50}; base=${3:-20200}; ok=0
logs=$(mktemp -d)
for i in $(seq 1 "$n"); do
    port=$((base + i))
    "$bin" serve --host 127.0.0.1 --port "$port" >"$logs/serve-$i.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 20); do
        curl -s -m 1 -o /dev/null "http://127.0.0.1:$port/health"
        sleep 0.2
    done
    code=$(curl -s -m 3 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")
    echo "run $i: $code"
    [ "$code" = 200 ] && ok=$((ok + 1))
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
done
echo "$ok of $n starts answered 200 (server logs in $logs)"
