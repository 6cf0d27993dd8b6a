#!/usr/bin/env python3
"""Does cutting a round at its stop string on the client side hold the server's
slot? (bench/README.md, issue 26.) seeker does not send stop strings to the
servers (they drop the matched string from the text); it closes the stream
when it sees one, and llama-server stops when it notices. This asks one
llama-server (1 slot) for the same greedy count, alternating:

- `client-cut`: streamed, the connection closed once the text holds " 12,";
- `server-stop`: streamed with `stop: [" 12,"]`, read to the end;

and right after each, a one-token request, whose latency shows whether the
slot was still busy with the cut round. Prints both modes' mean round and
next-request milliseconds.

usage: cut_cost.py URL   (a llama-server: tests/python/llama_server.py MODEL --threads 2 --parallel 1)
"""
import http.client, json, sys, time, statistics, urllib.parse
url = urllib.parse.urlparse(sys.argv[1])
PROMPT = "Count from 1 to 40: 1, 2, 3,"
def post(body, cut=None):
    c = http.client.HTTPConnection(url.hostname, url.port)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    text = ""
    if body.get("stream"):
        for line in r:
            if line.startswith(b"data: {"):
                text += json.loads(line[6:])["choices"][0]["text"]
                if cut and cut in text:
                    c.sock.close(); c.close(); return text
    else:
        r.read()
    c.close()
    return text
base = {"prompt": PROMPT, "max_tokens": 60, "temperature": 0, "stream": True, "cache_prompt": True}
res = {"client-cut": [], "server-stop": []}
for i in range(6):
    for mode in ["client-cut", "server-stop"] if i % 2 == 0 else ["server-stop", "client-cut"]:
        b = dict(base)
        if mode == "server-stop":
            b["stop"] = [" 12,"]
        t0 = time.perf_counter()
        post(b, cut=" 12," if mode == "client-cut" else None)
        t1 = time.perf_counter()
        post({"prompt": PROMPT, "max_tokens": 1, "temperature": 0, "stream": False, "cache_prompt": True})
        t2 = time.perf_counter()
        res[mode].append(((t1 - t0) * 1e3, (t2 - t1) * 1e3))
for m, v in res.items():
    print(m, "round ms", round(statistics.mean(a for a, _ in v)), "next request ms", round(statistics.mean(b for _, b in v)), [round(b) for _, b in v])
