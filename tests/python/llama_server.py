"""Serves a GGUF with llama.cpp's server (the xllamacpp wheel) on 127.0.0.1.

    python llama_server.py MODEL.gguf [--port 0] [--ctx 4096] [--parallel 2] [--threads 1] [--kv-f32]

Prints `llama-server listening on http://HOST:PORT` once it accepts requests, then
serves `/v1/completions`, `/v1/models`, `/health`, `/tokenize`, `/slots`,
`/apply-template` until SIGTERM or SIGINT. Used by seeker's remote-engine tests and
benchmark; also a quick way to try `model.engine = "remote"` without vLLM.
"""

import argparse
import signal
import sys

import xllamacpp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kv-f32", action="store_true",
                        help="F32 KV cache (llama.cpp's default is F16; seeker's is F32)")
    args = parser.parse_args()

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.n_ctx = args.ctx
    params.n_parallel = args.parallel
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    if args.kv_f32:
        params.cache_type_k = 0  # GGML_TYPE_F32
        params.cache_type_v = 0
    # Signals are waited for below, not handled by Python's default handlers.
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM, signal.SIGINT])
    server = xllamacpp.Server(params)
    print(f"llama-server listening on {server.listening_address}", flush=True)
    signal.sigwait([signal.SIGTERM, signal.SIGINT])
    sys.exit(0)


if __name__ == "__main__":
    main()
