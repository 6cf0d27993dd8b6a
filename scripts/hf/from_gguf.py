#!/usr/bin/env python3
"""Converts a GGUF model file into a Hugging Face checkpoint directory.

Run through scripts/hf-from-gguf.sh, which installs the pinned dependencies
(gguf-py, numpy); its header describes the output. Usage:

    from_gguf.py GGUF OUTDIR [--dtype f16|bf16|f32] [--shard-mib N]

Supported: architectures `qwen2` and `llama` (dense; no rope scaling, full
rotary), tokenizer `gpt2` (byte-level BPE) with pre-tokenizer `qwen2`,
`smollm` or `gpt2`. Anything else is refused with an error naming it.

The weights are dequantized with gguf-py's own `gguf.quants.dequantize` to
float32, then cast to the chosen dtype, one tensor at a time (never the whole
model in float32). GGUF lists a tensor's dimensions innermost first; the
safetensors shapes are written in PyTorch order (out_features, in_features).
llama.cpp's converter reorders the rows of each llama Q and K projection
(within every head, the two rotary halves are interleaved for its rope); that
reordering is undone here, and checked by re-applying it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

PROG = "hf-from-gguf"

# GGUF token types (tokenizer.ggml.token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Pre-tokenizer regexes by tokenizer.ggml.pre, as llama.cpp's llama-vocab.cpp
# splits text for each (applied in order, each splitting the pieces of the
# one before; the matches and the text between matches are both pieces).
GPT2_REGEX = (
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_REGEXES = {
    "qwen2": [QWEN2_REGEX],
    # StarCoder-style: every digit alone, then GPT-2's split.
    "smollm": [r"\p{N}", GPT2_REGEX],
    "gpt2": [GPT2_REGEX],
}

ARCHITECTURES = {
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "llama": ("LlamaForCausalLM", "llama"),
}

DTYPES = {
    # --dtype: (safetensors dtype, bytes per element, config torch_dtype)
    "f16": ("F16", 2, "float16"),
    "bf16": ("BF16", 2, "bfloat16"),
    "f32": ("F32", 4, "float32"),
}


class ConvertError(Exception):
    """A problem with the input or the output directory; printed as one line."""


def fail(message: str) -> None:
    raise ConvertError(message)


# ---------------------------------------------------------------- metadata


class Meta:
    """Typed access to a GGUF's key/value metadata."""

    def __init__(self, reader: Any, path: Path) -> None:
        self.reader = reader
        self.path = path

    def get(self, key: str, default: Any = None) -> Any:
        field = self.reader.fields.get(key)
        if field is None:
            return default
        return field.contents()

    def need(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            fail(f"{self.path}: metadata key {key} is missing")
        return value


def short_float(value: float) -> float:
    """A float32 metadata value as the shortest decimal that reads back as
    the same float32 (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(value)))


@dataclass
class Hyper:
    arch: str
    n_layer: int
    hidden: int
    ffn: int
    n_head: int
    n_head_kv: int
    head_dim: int
    key_length: int | None
    context: int
    rope_theta: float
    rms_eps: float


def read_hyper(meta: Meta) -> Hyper:
    arch = meta.need("general.architecture")
    if arch not in ARCHITECTURES:
        fail(
            f"{meta.path}: architecture {arch!r} is not supported "
            f"(supported: {', '.join(ARCHITECTURES)})"
        )
    p = f"{arch}."
    hidden = int(meta.need(p + "embedding_length"))
    n_head = int(meta.need(p + "attention.head_count"))
    n_head_kv = int(meta.get(p + "attention.head_count_kv", n_head))
    key_length = meta.get(p + "attention.key_length")
    value_length = meta.get(p + "attention.value_length")
    head_dim = int(key_length) if key_length is not None else hidden // n_head
    if value_length is not None and int(value_length) != head_dim:
        fail(f"{meta.path}: key_length {head_dim} != value_length {value_length}")
    rope_dims = meta.get(p + "rope.dimension_count")
    if rope_dims is not None and int(rope_dims) != head_dim:
        fail(
            f"{meta.path}: partial rotary embedding (rope.dimension_count "
            f"{rope_dims}, head size {head_dim}) is not supported"
        )
    scaling = meta.get(p + "rope.scaling.type")
    if scaling not in (None, "none"):
        fail(f"{meta.path}: rope scaling {scaling!r} is not supported")
    return Hyper(
        arch=arch,
        n_layer=int(meta.need(p + "block_count")),
        hidden=hidden,
        ffn=int(meta.need(p + "feed_forward_length")),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        key_length=None if key_length is None else int(key_length),
        context=int(meta.need(p + "context_length")),
        rope_theta=short_float(meta.get(p + "rope.freq_base", 10000.0)),
        rms_eps=short_float(meta.need(p + "attention.layer_norm_rms_epsilon")),
    )


# ------------------------------------------------------------------ tensors


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Hugging Face row order -> GGUF row order: what llama.cpp's converter
    does to llama Q/K (per head, row j of the first rotary half and row j
    of the second become rows 2j and 2j+1)."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """GGUF row order -> Hugging Face row order; inverse of permute_rows."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@dataclass
class Entry:
    """One output tensor: its Hugging Face name and shape, and where it
    comes from."""

    name: str
    shape: tuple[int, ...]
    source: Any  # gguf ReaderTensor
    unpermute_heads: int | None = None  # llama Q/K: heads to un-permute by

    def nbytes(self, dtype: str) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * DTYPES[dtype][1]


LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
REQUIRED_LAYER = [
    "attn_norm.weight",
    "ffn_norm.weight",
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
]


def plan_tensors(reader: Any, hp: Hyper, path: Path) -> tuple[list[Entry], bool]:
    """The output tensors in checkpoint order, and whether the embeddings are
    tied (the GGUF has no output.weight)."""
    by_name = {t.name: t for t in reader.tensors}
    used: set[str] = set()

    def take(gguf_name: str, hf_name: str, shape: tuple[int, ...], heads: int | None = None) -> Entry:
        t = by_name[gguf_name]
        got = tuple(int(d) for d in reversed(t.shape.tolist()))
        if got != shape:
            fail(f"{path}: tensor {gguf_name} has shape {got}, expected {shape}")
        used.add(gguf_name)
        return Entry(hf_name, shape, t, heads)

    if "token_embd.weight" not in by_name:
        fail(f"{path}: tensor token_embd.weight is missing")
    n_vocab = int(by_name["token_embd.weight"].shape[1])
    h, hd = hp.hidden, hp.head_dim
    q_rows, kv_rows = hp.n_head * hd, hp.n_head_kv * hd
    shapes = {
        "attn_norm.weight": (h,),
        "ffn_norm.weight": (h,),
        "attn_q.weight": (q_rows, h),
        "attn_q.bias": (q_rows,),
        "attn_k.weight": (kv_rows, h),
        "attn_k.bias": (kv_rows,),
        "attn_v.weight": (kv_rows, h),
        "attn_v.bias": (kv_rows,),
        "attn_output.weight": (h, q_rows),
        "attn_output.bias": (h,),
        "ffn_gate.weight": (hp.ffn, h),
        "ffn_up.weight": (hp.ffn, h),
        "ffn_down.weight": (h, hp.ffn),
    }
    permuted = {"attn_q": hp.n_head, "attn_k": hp.n_head_kv} if hp.arch == "llama" else {}

    entries = [take("token_embd.weight", "model.embed_tokens.weight", (n_vocab, h))]
    for i in range(hp.n_layer):
        for suffix in REQUIRED_LAYER:
            if f"blk.{i}.{suffix}" not in by_name:
                fail(f"{path}: tensor blk.{i}.{suffix} is missing")
        for suffix, hf_suffix in LAYER_NAMES.items():
            gname = f"blk.{i}.{suffix}"
            if gname in by_name:
                heads = permuted.get(suffix.split(".")[0])
                entries.append(take(gname, f"model.layers.{i}.{hf_suffix}", shapes[suffix], heads))
    if "output_norm.weight" not in by_name:
        fail(f"{path}: tensor output_norm.weight is missing")
    entries.append(take("output_norm.weight", "model.norm.weight", (h,)))
    tied = "output.weight" not in by_name
    if not tied:
        entries.append(take("output.weight", "lm_head.weight", (n_vocab, h)))

    unknown = sorted(set(by_name) - used)
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        fail(f"{path}: tensors this converter does not map: {', '.join(unknown[:5])}{more}")
    return entries, tied


def to_bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), rounding to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    out = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype("<u2")
    nan = np.isnan(a)
    if nan.any():
        out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype("<u2")
    return out


def tensor_data(entry: Entry, dtype: str, dequantize: Callable[[Any, Any], np.ndarray]) -> np.ndarray:
    """The entry's values, dequantized, in Hugging Face order and layout,
    as a contiguous little-endian array of the output dtype."""
    t = entry.source
    a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(entry.shape)
    if entry.unpermute_heads is not None:
        hf = unpermute_rows(a, entry.unpermute_heads)
        if not np.array_equal(permute_rows(hf, entry.unpermute_heads), a):
            fail(f"internal: un-permuting {t.name} does not invert llama.cpp's permutation")
        a = hf
    if dtype == "f32":
        out = a.astype("<f4")
    elif dtype == "f16":
        with np.errstate(over="ignore"):
            out = a.astype("<f2")
        if not np.isfinite(out).all() and np.isfinite(a).all():
            fail(f"{t.name}: values overflow float16; use --dtype bf16 or f32")
    else:
        out = to_bf16(a)
    return np.ascontiguousarray(out)


# -------------------------------------------------------------- safetensors


def shard_plan(entries: list[Entry], dtype: str, limit: int) -> list[list[Entry]]:
    """Greedy, in order: a new shard when the next tensor would take the
    current one past `limit` bytes (a tensor larger than it gets its own)."""
    shards: list[list[Entry]] = [[]]
    size = 0
    for e in entries:
        n = e.nbytes(dtype)
        if shards[-1] and size + n > limit:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += n
    return shards


def write_shard(path: Path, entries: list[Entry], dtype: str, dequantize: Callable) -> int:
    """Writes one safetensors file; returns the bytes of tensor data."""
    st_dtype = DTYPES[dtype][0]
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for e in entries:
        n = e.nbytes(dtype)
        header[e.name] = {"dtype": st_dtype, "shape": list(e.shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for e in entries:
            data = tensor_data(e, dtype, dequantize)
            if data.nbytes != e.nbytes(dtype):
                fail(f"internal: {e.name} is {data.nbytes} bytes, header says {e.nbytes(dtype)}")
            f.write(memoryview(data).cast("B"))
            del data
    if path.stat().st_size != 8 + len(raw) + offset:
        fail(f"internal: {path} has the wrong size")
    return offset


# ---------------------------------------------------------------- tokenizer


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@dataclass
class Vocab:
    tokens: list[str]
    types: list[int]
    merges: list[str]
    pre: str
    bos: int | None
    eos: int
    unk: int | None
    pad: int | None
    add_bos: bool
    add_eos: bool
    chat_template: str | None


def read_vocab(meta: Meta) -> Vocab:
    path = meta.path
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        fail(f"{path}: tokenizer.ggml.model is {model!r}; only 'gpt2' (byte-level BPE) is supported")
    pre = meta.get("tokenizer.ggml.pre")
    if pre not in PRE_REGEXES:
        fail(f"{path}: tokenizer.ggml.pre {pre!r} is not supported (supported: {', '.join(PRE_REGEXES)})")
    tokens = meta.need("tokenizer.ggml.tokens")
    types = meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    if len(types) != len(tokens):
        fail(f"{path}: {len(tokens)} tokens but {len(types)} token types")
    merges = meta.need("tokenizer.ggml.merges")

    def token_id(key: str) -> int | None:
        v = meta.get(key)
        if v is None:
            return None
        if not 0 <= int(v) < len(tokens):
            fail(f"{path}: {key} {v} is outside the vocabulary of {len(tokens)}")
        return int(v)

    eos = token_id("tokenizer.ggml.eos_token_id")
    if eos is None:
        fail(f"{path}: tokenizer.ggml.eos_token_id is missing")
    return Vocab(
        tokens=tokens,
        types=[int(t) for t in types],
        merges=merges,
        pre=pre,
        bos=token_id("tokenizer.ggml.bos_token_id"),
        eos=eos,
        unk=token_id("tokenizer.ggml.unknown_token_id"),
        pad=token_id("tokenizer.ggml.padding_token_id"),
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        chat_template=meta.get("tokenizer.chat_template"),
    )


def added_tokens(v: Vocab) -> list[dict[str, Any]]:
    """CONTROL tokens (special) and USER_DEFINED ones (not special): the
    tokens matched whole in text before the BPE runs."""
    return [
        {
            "id": i,
            "content": tok,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": kind == CONTROL,
        }
        for i, (tok, kind) in enumerate(zip(v.tokens, v.types))
        if kind in (CONTROL, USER_DEFINED) and tok
    ]


def tokenizer_json(v: Vocab, path: Path) -> dict[str, Any]:
    """tokenizer.json. Every GGUF token is in the BPE vocabulary under its
    GGUF id, the added tokens included: the tokenizers library numbers an
    added token that is not in the model's vocabulary from the vocabulary's
    size on load, ignoring the id written here, so the GGUF ids hold only if
    the vocabulary has them all (Qwen's unused [PAD…] tokens sit after its
    control tokens)."""
    vocab: dict[str, int] = {}
    for i, tok in enumerate(v.tokens):
        if tok in vocab:
            fail(f"{path}: token {tok!r} appears twice (ids {vocab[tok]} and {i})")
        vocab[tok] = i
    missing = [b for b, c in bytes_to_unicode().items() if c not in vocab]
    if missing:
        # SmolLM2's lacks 21 (some control bytes, bytes no UTF-8 text has):
        # llama.cpp and the tokenizers library both drop such a byte.
        print(
            f"{PROG}: note: the byte-level vocabulary has no token for {len(missing)} of the 256 bytes "
            f"({' '.join(f'{b:02x}' for b in missing)}); text with them loses them, as in llama.cpp",
            file=sys.stderr,
        )
    for m in v.merges:
        parts = m.split(" ")
        if len(parts) != 2 or parts[0] not in vocab or parts[1] not in vocab or parts[0] + parts[1] not in vocab:
            fail(f"{path}: merge {m!r} is not two vocabulary tokens forming a third")

    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    splits = [
        {"type": "Split", "pattern": {"Regex": rx}, "behavior": "Isolated", "invert": False}
        for rx in PRE_REGEXES[v.pre]
    ]
    post: dict[str, Any] = dict(byte_level)
    if v.add_bos or v.add_eos:
        # llama.cpp adds BOS in front (and EOS after) when the GGUF asks.
        def special(i: int | None, what: str) -> dict[str, Any]:
            if i is None:
                fail(f"{path}: tokenizer.ggml.add_{what}_token is set but there is no {what} token id")
            return {"SpecialToken": {"id": v.tokens[i], "type_id": 0}}

        def seq(name: str, type_id: int) -> list[dict[str, Any]]:
            s = [{"Sequence": {"id": name, "type_id": type_id}}]
            return ([special(v.bos, "bos")] if v.add_bos else []) + s + ([special(v.eos, "eos")] if v.add_eos else [])

        ids = ([v.bos] if v.add_bos else []) + ([v.eos] if v.add_eos else [])
        template = {
            "type": "TemplateProcessing",
            "single": seq("A", 0),
            "pair": seq("A", 0) + seq("B", 1),
            "special_tokens": {
                v.tokens[i]: {"id": v.tokens[i], "ids": [i], "tokens": [v.tokens[i]]} for i in ids if i is not None
            },
        }
        post = {"type": "Sequence", "processors": [dict(byte_level), template]}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens(v),
        "normalizer": {"type": "NFC"} if v.pre == "qwen2" else None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": splits + [dict(byte_level)]},
        "post_processor": post,
        "decoder": dict(byte_level),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": list(v.merges),
        },
    }


def tokenizer_config(v: Vocab, hp: Hyper) -> dict[str, Any]:
    def text(i: int | None) -> str | None:
        return None if i is None else v.tokens[i]

    return {
        "add_bos_token": v.add_bos,
        "add_eos_token": v.add_eos,
        "added_tokens_decoder": {
            str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
            for t in added_tokens(v)
        },
        "bos_token": text(v.bos),
        "chat_template": v.chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": text(v.eos),
        "errors": "replace",
        "model_max_length": hp.context,
        "pad_token": text(v.pad),
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer" if v.pre == "qwen2" else "GPT2Tokenizer",
        "unk_token": text(v.unk),
    }


def generation_eos(v: Vocab, hp: Hyper) -> int | list[int]:
    """The GGUF's EOS; for a Qwen chat model (its template ends turns with
    <|im_end|>) also <|im_end|> and <|endoftext|>, as Qwen's own
    generation_config.json lists them."""
    ids = [v.eos]
    if hp.arch == "qwen2" and v.chat_template and "<|im_end|>" in v.chat_template:
        index = {t: i for i, t in enumerate(v.tokens) if t in ("<|im_end|>", "<|endoftext|>")}
        if len(index) == 2:
            ids += [index[t] for t in ("<|im_end|>", "<|endoftext|>") if index[t] not in ids]
    return ids[0] if len(ids) == 1 else ids


# ------------------------------------------------------------------- config


def config_json(hp: Hyper, v: Vocab, n_vocab: int, tied: bool, attention_bias: bool, dtype: str) -> dict[str, Any]:
    architecture, model_type = ARCHITECTURES[hp.arch]
    c: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": hp.hidden,
        "intermediate_size": hp.ffn,
        "num_hidden_layers": hp.n_layer,
        "num_attention_heads": hp.n_head,
        "num_key_value_heads": hp.n_head_kv,
    }
    if hp.key_length is not None:
        c["head_dim"] = hp.head_dim
    c.update(
        {
            "max_position_embeddings": hp.context,
            "rope_theta": hp.rope_theta,
            "rope_scaling": None,
            "rms_norm_eps": hp.rms_eps,
            "vocab_size": n_vocab,
            "hidden_act": "silu",
            "attention_bias": attention_bias,
            "attention_dropout": 0.0,
            "tie_word_embeddings": tied,
            "torch_dtype": DTYPES[dtype][2],
            "bos_token_id": v.bos,
            "eos_token_id": v.eos,
            "use_cache": True,
        }
    )
    if hp.arch == "qwen2":
        c.update(
            {
                "use_sliding_window": False,
                "sliding_window": hp.context,
                "max_window_layers": hp.n_layer,
            }
        )
    else:
        c["mlp_bias"] = False
    return c


# --------------------------------------------------------------------- main


def write_json(path: Path, value: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, indent=2)
        f.write("\n")


def open_gguf(path: Path) -> Any:
    if not path.exists():
        fail(f"{path}: no such file")
    if not path.is_file():
        fail(f"{path}: not a regular file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        fail(f"{path}: not a GGUF file (starts with {magic!r}, not b'GGUF')")
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except Exception as e:  # a damaged or truncated file
        fail(f"{path}: cannot read the GGUF (damaged or truncated?): {e}")


def convert(gguf_path: Path, outdir: Path, dtype: str, shard_bytes: int) -> None:
    start = time.monotonic()
    if outdir.exists() and (not outdir.is_dir() or any(outdir.iterdir())):
        kind = "a directory that is not empty" if outdir.is_dir() else "not a directory"
        fail(f"{outdir}: already exists and is {kind}; remove it or choose another OUTDIR")
    reader = open_gguf(gguf_path)
    meta = Meta(reader, gguf_path)
    hp = read_hyper(meta)
    vocab = read_vocab(meta)
    entries, tied = plan_tensors(reader, hp, gguf_path)
    n_vocab = entries[0].shape[0]
    if len(vocab.tokens) != n_vocab:
        fail(f"{gguf_path}: {len(vocab.tokens)} tokens but token_embd.weight has {n_vocab} rows")
    declared = meta.get(f"{hp.arch}.vocab_size")
    if declared is not None and int(declared) != n_vocab:
        fail(f"{gguf_path}: {hp.arch}.vocab_size {declared} != {n_vocab} tokens")
    attention_bias = any(e.name.endswith("q_proj.bias") for e in entries)
    tok_json = tokenizer_json(vocab, gguf_path)

    from gguf.quants import dequantize

    partial = outdir.with_name(outdir.name + ".partial")
    if partial.exists():
        print(f"{PROG}: removing {partial} left by an earlier run", file=sys.stderr)
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    try:
        shards = shard_plan(entries, dtype, shard_bytes)
        n = len(shards)
        total = 0
        weight_map: dict[str, str] = {}
        for k, shard in enumerate(shards, 1):
            name = "model.safetensors" if n == 1 else f"model-{k:05d}-of-{n:05d}.safetensors"
            t0 = time.monotonic()
            size = write_shard(partial / name, shard, dtype, dequantize)
            total += size
            weight_map.update((e.name, name) for e in shard)
            print(
                f"{name}: {len(shard)} tensors, {size / 2**20:.1f} MiB, {time.monotonic() - t0:.1f} s",
                flush=True,
            )
        if n > 1:
            write_json(
                partial / "model.safetensors.index.json",
                {"metadata": {"total_size": total}, "weight_map": weight_map},
            )
        write_json(partial / "config.json", config_json(hp, vocab, n_vocab, tied, attention_bias, dtype))
        gen: dict[str, Any] = {}
        if vocab.bos is not None:
            gen["bos_token_id"] = vocab.bos
        gen["eos_token_id"] = generation_eos(vocab, hp)
        if vocab.pad is not None:
            gen["pad_token_id"] = vocab.pad
        gen["do_sample"] = False
        write_json(partial / "generation_config.json", gen)
        with open(partial / "tokenizer.json", "w", encoding="utf-8") as f:
            json.dump(tok_json, f, ensure_ascii=False)
        write_json(partial / "tokenizer_config.json", tokenizer_config(vocab, hp))
        if outdir.exists():
            outdir.rmdir()  # empty, checked above
        partial.rename(outdir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    print(
        f"{outdir}: {len(entries)} tensors ({hp.arch}, {dtype}, "
        f"{'tied' if tied else 'untied'} embeddings), {total} bytes in {n} shard(s), "
        f"{time.monotonic() - start:.1f} s"
    )


def main() -> int:
    ap = argparse.ArgumentParser(prog=PROG, description="GGUF -> Hugging Face checkpoint directory")
    ap.add_argument("gguf", type=Path, help="input .gguf file")
    ap.add_argument("outdir", type=Path, help="output directory (must not exist, or be empty)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f16", help="weight dtype (default f16)")
    ap.add_argument("--shard-mib", type=int, default=1024, help="largest shard in MiB (default 1024)")
    args = ap.parse_args()

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)  # clean up OUTDIR.partial as on ^C
    if args.shard_mib < 1:
        ap.error("--shard-mib must be at least 1")
    try:
        convert(args.gguf, args.outdir, args.dtype, args.shard_mib * 2**20)
    except ConvertError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; nothing written to {args.outdir}", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
