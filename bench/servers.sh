# Shared by the engine benchmarks (bench/remote.sh, bench/loop.sh): start
# llama.cpp servers and seeker servers in the background, stop them all.
# Source it after setting GGUF (the model llama.cpp serves), SEEKER (the
# seeker binary), PY (the venv with xllamacpp) and OUT (the output folder).

# Servers are started in $(...) subshells: their pids go to a file.
PIDS="$OUT/pids"
: >"$PIDS"
# Every seeker started here logs its errors to one file, and every llama.cpp
# server its log (one `print_timing` block a request: tokens prefilled and
# decoded) to another, both emptied per run.
: >"$OUT/seeker.err"
: >"$OUT/llama.log"
stop_all() {
    xargs -r kill <"$PIDS" 2>/dev/null || true
    sleep 1
    : >"$PIDS"
}
trap stop_all EXIT

# llama THREADS [SLOTS] -> prints its URL once it listens (SLOTS default 2)
llama() {
    local log
    log=$(mktemp)
    "$PY" tests/python/llama_server.py "$GGUF" --threads "$1" --parallel "${2:-2}" --ctx 8192 \
        >"$log" 2>>"$OUT/llama.log" &
    echo $! >>"$PIDS"
    for _ in $(seq 1 600); do
        grep -q "listening on" "$log" && break
        sleep 0.1
    done
    sed -n 's/^llama-server listening on //p' "$log"
}

# seeker ENV... -> prints its URL once healthy
seeker() {
    local log
    log=$(mktemp)
    env "$@" RUST_LOG=warn "$SEEKER" serve --port 0 >"$log" 2>>"$OUT/seeker.err" &
    local pid=$!
    echo $pid >>"$PIDS"
    for _ in $(seq 1 600); do
        grep -q "listening on" "$log" && break
        # A server that exited (a bad config or profile) is not waited for.
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    local url
    url=$(sed -n 's/^seeker listening on //p' "$log")
    for _ in $(seq 1 3000); do
        [[ -n $url ]] || break
        # It prints its address before the model loads: a load that fails ends it.
        kill -0 "$pid" 2>/dev/null || { url=; break; }
        curl -sf "$url/health" >/dev/null && break
        sleep 0.2
    done
    echo "$url"
}
