#!/usr/bin/env python3
"""Time to the first token of one long prompt through a running `seeker serve`.

Usage: python3 bench/serve_ttft.py URL PROMPT_FILE

Sends the file's text as the user message of one streamed chat request
(`max_tokens: 1`, greedy) to URL (e.g. http://127.0.0.1:8080) and prints one
JSON object: `ttft_s` (request to the first content or reasoning delta),
`total_s`, and the response's `usage` (prompt tokens as the server counted
them); `ttft_s` is null when no text arrived. The prompt files
`bench/prefill.sh` writes ($OUT/MODEL-LENGTH.txt) are whole rendered prompts:
sent here they are wrapped in the chat template again (and their control
tokens defused), so the server counts somewhat more tokens than the file's
length (4,182 for the 4,000 point).
"""
import json
import sys
import time
import urllib.request

if len(sys.argv) != 3:
    raise SystemExit(__doc__)
url, path = sys.argv[1].rstrip("/"), sys.argv[2]
text = open(path, encoding="utf-8").read()
body = json.dumps({
    "model": "default",
    "messages": [{"role": "user", "content": "Summarise these documents in one word.\n" + text}],
    "max_tokens": 1, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
}).encode()
request = urllib.request.Request(f"{url}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
started, first, usage = time.time(), None, None
with urllib.request.urlopen(request, timeout=3600) as response:
    for line in response:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: "):])
        delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
        if first is None and (delta.get("content") or delta.get("reasoning_content")):
            first = time.time()
        usage = chunk.get("usage") or usage
print(json.dumps({"ttft_s": None if first is None else first - started,
                  "total_s": time.time() - started, "usage": usage}))
