#!/usr/bin/env bash
# Usage: scripts/hf-from-gguf.sh GGUF OUTDIR [--dtype f16|bf16|f32] [--shard-mib N]
#
# Converts a GGUF model file (architectures qwen2 and llama, byte-level BPE
# tokenizer) into a Hugging Face checkpoint directory that mistral.rs's plain
# (safetensors) loader reads. It exists because the tests and benchmarks of
# serving Hugging Face checkpoints need one, and none can be downloaded
# offline; the GGUFs under models/ can. The weights are the GGUF's
# dequantized (so they carry its quantization error), cast to --dtype
# (default f16).
#
# GGUF and OUTDIR are relative to the caller's directory. OUTDIR must not
# exist or be empty; the checkpoint is written to
# OUTDIR.partial and renamed at the end, so an interrupted run leaves no
# half directory. Layout:
#   config.json              architecture and hyper-parameters
#   generation_config.json   bos/eos ids, greedy
#   tokenizer.json           the GGUF's tokenizer, Hugging Face format
#   tokenizer_config.json    chat template, special tokens
#   model.safetensors        when all tensors fit in one --shard-mib (default
#                            1024) shard; else
#   model-0000i-of-0000n.safetensors + model.safetensors.index.json
#
# The converter is scripts/hf/from_gguf.py; its dependencies (gguf-py, numpy,
# pinned with hashes in scripts/hf/requirements.txt) go into target/hf-venv
# (scripts/pinned-venv.sh), reinstalled when the requirements change.
set -euo pipefail
HERE=$PWD
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=$(scripts/pinned-venv.sh target/hf-venv scripts/hf/requirements.txt)
# GGUF and OUTDIR are read relative to the caller's directory.
cd "$HERE"
exec "$PY" "$ROOT/scripts/hf/from_gguf.py" "$@"
