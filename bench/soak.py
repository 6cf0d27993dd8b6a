#!/usr/bin/env python3
"""Memory soak: resident memory of a seeker server under sequential and
concurrent load (issue: "Memory under load"). Not a test; a report generator.

Starts `seeker serve` (the binary given) on a free port with the default model,
waits for /health, then
  phase 1: N sequential short chat requests (default 300),
  phase 2: M requests from C concurrent clients (default 100 from 8),
sampling the server's VmRSS (/proc/PID/status) every 0.5 s and after every
request. Questions are distinct FanOutQA dev sub-questions, so every prompt
differs (no accidental reuse across requests). Prints a summary and writes the
full curves as JSON.

usage: bench/soak.py [--bin target/release/seeker] [--config config/small.toml]
                     [--sequential 300] [--concurrent 100] [--clients 8]
                     [--max-tokens 8] [--policy search-r1] [--out target/soak.json]

Latencies: p50/p90/p99 per phase; the concurrent phase's p99 is also given as a
multiple of the sequential (solo) median. The server's prefix-reuse counters
(/metrics) are read at the end.
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        m = re.search(r"VmRSS:\s+(\d+) kB", f.read())
    return int(m.group(1)) / 1024


def questions(path, n):
    data = json.load(open(path))
    out, seen = [], set()
    for q in data:
        for sub in q.get("decomposition", []):
            text = sub["question"].strip()
            if text not in seen:
                seen.add(text)
                out.append(text)
    if len(out) < n:
        sys.exit(f"only {len(out)} distinct questions in {path}")
    return out[:n]


def ask(url, question, args):
    body = json.dumps({
        "model": "default",
        "policy": args.policy,
        "max_tokens": args.max_tokens,
        "messages": [{"role": "user", "content": question}],
    }).encode()
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=body,
                                 headers={"content-type": "application/json"})
    started = time.monotonic()
    with urllib.request.urlopen(req, timeout=600) as r:
        answer = json.loads(r.read())
    return time.monotonic() - started, answer["usage"]


class Sampler(threading.Thread):
    """Samples RSS every `period` s into `samples` as (seconds, MiB)."""

    def __init__(self, pid, period=0.5):
        super().__init__(daemon=True)
        self.pid, self.period, self.samples = pid, period, []
        self.start_time = time.monotonic()
        self.stopped = threading.Event()

    def mark(self):
        self.samples.append((time.monotonic() - self.start_time, rss_mib(self.pid)))

    def run(self):
        while not self.stopped.wait(self.period):
            self.mark()


def summary(name, rss_after, latencies, tokens):
    n = len(rss_after)
    first10 = sum(rss_after[:10]) / min(10, n)
    last10 = sum(rss_after[-10:]) / min(10, n)
    lat = sorted(latencies)
    return {
        "phase": name,
        "requests": n,
        "rss_start_mib": round(rss_after[0], 1),
        "rss_end_mib": round(rss_after[-1], 1),
        "rss_max_mib": round(max(rss_after), 1),
        "rss_mean_first_10_mib": round(first10, 1),
        "rss_mean_last_10_mib": round(last10, 1),
        "latency_p50_s": round(lat[len(lat) // 2], 2),
        "latency_p90_s": round(lat[min(n - 1, int(n * 0.9))], 2),
        "latency_p99_s": round(lat[min(n - 1, int(n * 0.99))], 2),
        "latency_max_s": round(lat[-1], 2),
        "prompt_tokens_mean": round(sum(t["prompt_tokens"] for t in tokens) / n, 1),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/seeker")
    p.add_argument("--config", default=None, help="passed to `seeker serve --config`")
    p.add_argument("--sequential", type=int, default=300)
    p.add_argument("--concurrent", type=int, default=100)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--policy", default="search-r1")
    p.add_argument("--dataset", default="data/fanoutqa/dev.json")
    p.add_argument("--out", default="target/soak.json")
    args = p.parse_args()

    qs = questions(args.dataset, args.sequential + args.concurrent)
    port = free_port()
    env = dict(os.environ, SEEKER_SERVER__MAX_CONCURRENT_REQUESTS=str(args.clients * 2))
    command = [args.bin, "serve", "--port", str(port)]
    if args.config:
        command += ["--config", args.config]
    server = subprocess.Popen(command, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            sys.exit("the server did not become healthy")
        print(f"server pid {server.pid} ready; RSS after load {rss_mib(server.pid):.1f} MiB")
        sampler = Sampler(server.pid)
        sampler.start()

        rss, lat, tok = [], [], []
        for i, q in enumerate(qs[:args.sequential]):
            seconds, usage = ask(url, q, args)
            rss.append(rss_mib(server.pid))
            lat.append(seconds)
            tok.append(usage)
            if i % 25 == 0:
                print(f"  sequential {i + 1}/{args.sequential}: RSS {rss[-1]:.1f} MiB, {seconds:.2f} s")
        seq = summary("sequential", rss, lat, tok)
        seq_curve = rss

        rss, lat, tok = [], [], []
        lock = threading.Lock()

        def one(q):
            seconds, usage = ask(url, q, args)
            with lock:
                rss.append(rss_mib(server.pid))
                lat.append(seconds)
                tok.append(usage)
                if len(rss) % 10 == 0:
                    print(f"  concurrent {len(rss)}/{args.concurrent}: RSS {rss[-1]:.1f} MiB")

        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(one, qs[args.sequential:]))
        conc = summary(f"concurrent ({args.clients} clients)", rss, lat, tok)
        conc["p99_over_solo_median"] = round(conc["latency_p99_s"] / seq["latency_p50_s"], 2)
        sampler.stopped.set()
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        reuse = {}
        for line in metrics.splitlines():
            if line.startswith(("seeker_prompt_tokens_cached_total", "seeker_prompt_tokens_prefilled_total",
                                "seeker_prefix_cache_flushes_total", "seeker_prefix_cache_bytes")):
                name, value = line.rsplit(" ", 1)
                reuse[name] = float(value)

        report = {
            "binary": args.bin,
            "policy": args.policy,
            "max_tokens": args.max_tokens,
            "phases": [seq, conc],
            "prefix_reuse": reuse,
            "curves": {"sequential_rss_after_each_mib": seq_curve,
                       "concurrent_rss_after_each_mib": rss,
                       "sampled_rss_mib": sampler.samples},
        }
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        json.dump(report, open(args.out, "w"), indent=1)
        for s in (seq, conc):
            print(json.dumps(s))
        print(json.dumps(reuse))
        print(f"curves in {args.out}")
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
