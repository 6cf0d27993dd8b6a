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

  phase 3 (--mixed N, issue 28): N requests from the same C clients, mixed
  lengths (max_tokens cycling through --mixed-max-tokens; every 20th request
  carries an earlier user turn of ~150 distinct tokens), and a share
  (--abandon, 0.1 = every 10th) streamed and dropped after the first content
  chunk. RSS is compared after the first --warmup requests of the phase and
  at its end, and `seeker_prefix_cache_bytes` is read from /metrics every
  second: its maximum is reported beside the budget.

usage: bench/soak.py [--bin target/release/seeker] [--config config/small.toml]
                     [--sequential 300] [--concurrent 100] [--clients 8]
                     [--mixed 0] [--warmup 200] [--abandon 0.1]
                     [--mixed-max-tokens 4,8,16]
                     [--max-tokens 8] [--policy search-r1] [--out target/soak.json]

Latencies: p50/p90/p99 per phase; the concurrent phase's p99 is also given as a
multiple of the sequential (solo) median. The server's prefix-reuse counters
(/metrics) are read at the end.
"""

import argparse
import http.client
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
    # Past the distinct questions, repeats with a numbered suffix (still
    # distinct prompts).
    base = len(out)
    while len(out) < n:
        out.append(f"{out[len(out) % base]} ({len(out) // base + 1})")
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


def ask_mixed(url, messages, max_tokens, policy, abandon):
    """One request of the mixed phase. Abandoned ones are streamed and the
    connection is closed after the first content chunk. Returns (seconds,
    prompt tokens or None, abandoned)."""
    body = {"model": "default", "policy": policy, "max_tokens": max_tokens,
            "messages": messages}
    if not abandon:
        body = json.dumps(body).encode()
        req = urllib.request.Request(f"{url}/v1/chat/completions", data=body,
                                     headers={"content-type": "application/json"})
        started = time.monotonic()
        with urllib.request.urlopen(req, timeout=600) as r:
            answer = json.loads(r.read())
        return time.monotonic() - started, answer["usage"]["prompt_tokens"], False
    body["stream"] = True
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    started = time.monotonic()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"content-type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"abandoned request: HTTP {r.status}")
    while True:
        line = r.fp.readline()
        if not line:
            break
        if line.startswith(b"data: {") and (b'"content"' in line or b'"reasoning_content"' in line):
            break
    conn.sock.close()
    conn.close()
    return time.monotonic() - started, None, True


def metric(url, name):
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    return None


class CacheSampler(threading.Thread):
    """Reads `seeker_prefix_cache_bytes` every `period` s; keeps the maximum."""

    def __init__(self, url, period=1.0):
        super().__init__(daemon=True)
        self.url, self.period, self.max_bytes, self.reads = url, period, 0.0, 0
        self.stopped = threading.Event()

    def run(self):
        while not self.stopped.wait(self.period):
            value = metric(self.url, "seeker_prefix_cache_bytes")
            if value is not None:
                self.max_bytes = max(self.max_bytes, value)
                self.reads += 1


def around_drops(rss):
    """(after, before): RSS right after and right before each sharp fall of
    the curve (a fall of more than a quarter of its range: a cache flush),
    as (request number, MiB) pairs."""
    span = max(rss) - min(rss) if rss else 0
    after, before = [], []
    for i in range(1, len(rss)):
        if span and rss[i - 1] - rss[i] > span / 4:
            after.append((i + 1, round(rss[i], 1)))
            before.append((i, round(rss[i - 1], 1)))
    return after, before


def mixed_phase(url, pid, qs, args):
    """Phase 3: see the module documentation."""
    lengths = [int(t) for t in args.mixed_max_tokens.split(",")]
    every = round(1 / args.abandon) if args.abandon > 0 else 0
    filler = "The quick brown fox {i} jumps over the lazy dog near river bank {i}. "
    jobs = []
    for i, q in enumerate(qs):
        messages = [{"role": "user", "content": q}]
        if i % 20 == 7:
            earlier = "".join(filler.format(i=i * 100 + k) for k in range(10))
            messages = [{"role": "user", "content": earlier},
                        {"role": "assistant", "content": "Noted."}] + messages
        abandon = bool(every) and i % every == every - 1
        # An abandoned request is left while it still has tokens to write.
        max_tokens = 4 * max(lengths) if abandon else lengths[i % len(lengths)]
        jobs.append((i, messages, max_tokens, abandon))
    cache = CacheSampler(url)
    cache.start()
    done, rss, lat, prompt, abandoned, failures = [0], [], [], [], [0], []
    lock = threading.Lock()
    marks = {}

    def one(job):
        i, messages, max_tokens, abandon = job
        try:
            seconds, prompt_tokens, gone = ask_mixed(url, messages, max_tokens, args.policy, abandon)
        except Exception as e:  # noqa: BLE001 - a failure is reported, not fatal
            with lock:
                failures.append(f"request {i}: {e}")
            return
        with lock:
            done[0] += 1
            rss.append(rss_mib(pid))
            lat.append(seconds)
            abandoned[0] += gone
            if prompt_tokens is not None:
                prompt.append(prompt_tokens)
            if done[0] == args.warmup:
                marks["warmup"] = rss[-1]
            if done[0] % 50 == 0:
                print(f"  mixed {done[0]}/{len(jobs)}: RSS {rss[-1]:.1f} MiB, "
                      f"cache max {cache.max_bytes / 2**20:.1f} MiB", flush=True)

    started = time.monotonic()
    with ThreadPoolExecutor(args.clients) as pool:
        list(pool.map(one, jobs))
    wall = time.monotonic() - started
    time.sleep(2)
    cache.stopped.set()
    end_rss = rss_mib(pid)
    lat_sorted = sorted(lat)
    n = len(lat_sorted)
    warm = marks.get("warmup")
    after = rss[args.warmup:] or rss
    return {
        "phase": f"mixed ({args.clients} clients, {args.abandon:.0%} abandoned)",
        "requests": len(jobs),
        "answered": n,
        "abandoned": abandoned[0],
        "failures": failures[:20],
        "failure_count": len(failures),
        "wall_s": round(wall, 1),
        "rss_after_warmup_mib": round(warm, 1) if warm else None,
        "rss_end_mib": round(end_rss, 1),
        "rss_end_over_warmup": round(end_rss / warm, 3) if warm else None,
        "rss_max_after_warmup_mib": round(max(after), 1),
        "rss_max_mib": round(max(rss), 1),
        "rss_after_each_fall_mib": around_drops(rss)[0],
        "rss_before_each_fall_mib": around_drops(rss)[1],
        "prefix_cache_bytes_max_mib": round(cache.max_bytes / 2**20, 1),
        "prefix_cache_reads": cache.reads,
        "prompt_tokens_min": min(prompt) if prompt else None,
        "prompt_tokens_max": max(prompt) if prompt else None,
        "prompt_tokens_mean": round(sum(prompt) / len(prompt), 1) if prompt else None,
        "latency_p50_s": round(lat_sorted[n // 2], 2),
        "latency_p90_s": round(lat_sorted[min(n - 1, int(n * 0.9))], 2),
        "latency_p99_s": round(lat_sorted[min(n - 1, int(n * 0.99))], 2),
        "latency_max_s": round(lat_sorted[-1], 2),
    }, rss


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
    p.add_argument("--mixed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--abandon", type=float, default=0.1)
    p.add_argument("--mixed-max-tokens", default="4,8,16")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--policy", default="search-r1")
    p.add_argument("--dataset", default="data/fanoutqa/dev.json")
    p.add_argument("--out", default="target/soak.json")
    args = p.parse_args()

    qs = questions(args.dataset, args.sequential + args.concurrent + args.mixed)
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

        phases, curves = [], {}
        rss, lat, tok = [], [], []
        for i, q in enumerate(qs[:args.sequential]):
            seconds, usage = ask(url, q, args)
            rss.append(rss_mib(server.pid))
            lat.append(seconds)
            tok.append(usage)
            if i % 25 == 0:
                print(f"  sequential {i + 1}/{args.sequential}: RSS {rss[-1]:.1f} MiB, {seconds:.2f} s")
        if args.sequential:
            seq = summary("sequential", rss, lat, tok)
            phases.append(seq)
            curves["sequential_rss_after_each_mib"] = rss

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
            list(pool.map(one, qs[args.sequential:args.sequential + args.concurrent]))
        if args.concurrent:
            conc = summary(f"concurrent ({args.clients} clients)", rss, lat, tok)
            if args.sequential:
                conc["p99_over_solo_median"] = round(conc["latency_p99_s"] / seq["latency_p50_s"], 2)
            phases.append(conc)
            curves["concurrent_rss_after_each_mib"] = rss
        if args.mixed:
            mixed, rss = mixed_phase(url, server.pid, qs[args.sequential + args.concurrent:], args)
            phases.append(mixed)
            curves["mixed_rss_after_each_mib"] = rss
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
            "phases": phases,
            "prefix_reuse": reuse,
            "curves": dict(curves, sampled_rss_mib=sampler.samples),
        }
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        json.dump(report, open(args.out, "w"), indent=1)
        for s in phases:
            print(json.dumps(s))
        print(json.dumps(reuse))
        print(f"curves in {args.out}")
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
