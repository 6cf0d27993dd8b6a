#!/usr/bin/env python3
"""Splits a `perf record --call-graph dwarf` profile of seeker's embedded engine
into the parts issue 26 asks about: mistral.rs's CPU attention, candle's matmul
kernels and other ops, mistral.rs's own work (scheduling, sampling, logits
processors), tokenizing, seeker, thread hand-offs and memory.

Usage: python3 bench/perf_split.py PERF_DATA [--top N]

Each sample goes to the part of the first frame, leaf upwards, that names one:
generic frames (closures `call_mut`/`call_once`, `core::`/`alloc::`/`std::`, libm's
`expf`, rayon's plumbing) are looked through, because rayon runs the kernels'
closures on worker threads whose stacks do not show who queued them. A closure
that a sample shows calling mistral.rs's `vec_dot_f32` is the flash-attention row
closure (`attention/backends/cpu.rs`), and every sample in it counts as attention.
Any other closure (a rayon job with its kernel inlined, such as candle's quantized
matmul rows) goes to the function the binary's symbol table (`nm`) lists just
before it that is not itself generic: rustc places a function's closures beside it.
Kernel frames count as memory (page faults, page allocation) or thread hand-offs
(futex, scheduler) by the first kernel frame that says so.
Prints a markdown table of the parts and the top N leaf symbols.
"""
import argparse
import bisect
import re
import subprocess

# (part, pattern on a frame's symbol), tried in order on each frame.
PARTS = [
    ("attention (mistral.rs `flash_attn_cpu`)", r"attention::backends::cpu|flash_attn|mask_offset"),
    ("seeker (sentinel processor, channels, engine glue)", r"^seeker::|engine_bench::|<seeker::"),
    ("sampling and logits processors (mistral.rs)", r"sampler::|Sampler|CustomLogitsProcessor|argmax_f32|partial_sort"),
    ("tokenizer / detokenizing", r"tokenizers::|<tokenizers::"),
    ("quantized matmul kernels (candle)", r"k_quants|quantized::|vec_dot_q|QMatMul|BlockQ|matmul_t|QTensor|mistralrs_quant"),
    ("dense matmul kernels (`gemm`)", r"^gemm|gemm_f32|gemm_common|<gemm"),
    ("other candle ops (norms, rope, softmax, copies, elementwise)", r"candle_core::|candle_nn::|<candle_core::|<candle_nn::"),
    ("mistral.rs engine and model code", r"mistralrs_core::|<mistralrs_core::|mistralrs::"),
    ("async runtime (tokio)", r"tokio::|<tokio::"),
]
MEMORY_K = r"page_fault|handle_mm_fault|alloc_pages|clear_page|rmqueue|do_anonymous|do_wp_page|__pte|folio|munmap|mmap|zap_"
HANDOFF_K = r"futex|schedule|sched_|finish_task_switch|try_to_wake|pick_next|syscall|do_nanosleep|ep_poll|yield"
LEAF_MEMORY = r"memcpy|memmove|memset|malloc|_int_malloc|_int_free|cfree|realloc|__rust_alloc|__rust_dealloc|__libc_free"
LEAF_HANDOFF = r"^rayon|crossbeam|sched_yield|parking_lot|std::sys::sync|__lll_lock|pthread_cond|futex"
GENERIC = r"call_mut|call_once|^core::|^alloc::|^std::|^<core::|^<alloc::|^<std::|expf|^exp$|^rayon|^<rayon|^__|^_start|start_thread|^clone3?$|^top12$|^asuint|^checkint|^eval_as_float|^__math"


def frames_of(report):
    """Yields (period, [(symbol, start, dso), ...] leaf first) per sample."""
    sample = None
    for line in report.splitlines():
        if not line.strip():
            if sample and sample[1]:
                yield sample
            sample = None
            continue
        if not line.startswith("\t") and sample is None:
            m = re.match(r"\s*(\d+)", line)
            sample = (int(m.group(1)) if m else 1, [])
            continue
        m = re.match(r"\s*([0-9a-f]+)\s+(.*?)(?:\+0x([0-9a-f]+))?\s+\((.*)\)\s*$", line)
        if m and sample is not None:
            addr, sym, off, dso = m.groups()
            start = int(addr, 16) - int(off or "0", 16)
            sample[1].append((sym, start, dso))
    if sample and sample[1]:
        yield sample


def owners(samples):
    """Maps a closure's start address (as perf reports it) to the nearest
    preceding non-generic symbol of its binary, from `nm`."""
    dsos = {dso for _, frames in samples for _, _, dso in frames if dso.startswith("/")}
    starts = {(dso, start) for _, frames in samples for sym, start, dso in frames if "call_mut" in sym or "call_once" in sym}
    named = {}
    for _, frames in samples:
        for sym, start, dso in frames:
            named.setdefault((dso, sym), start)
    result = {}
    for dso in dsos:
        try:
            nm = subprocess.run(["nm", "-C", "--defined-only", dso], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            continue
        table = []
        for line in nm.splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[1] in "tTwW":
                table.append((int(parts[0], 16), parts[2]))
        table.sort()
        by_name = {}
        for addr, name in table:
            by_name.setdefault(name, []).append(addr)
        # perf's addresses and nm's differ by the load offset; find it from
        # symbols that occur once.
        deltas = {}
        for (d, sym), start in named.items():
            if d == dso and len(by_name.get(sym, [])) == 1:
                delta = by_name[sym][0] - start
                deltas[delta] = deltas.get(delta, 0) + 1
        if not deltas:
            continue
        delta = max(deltas, key=deltas.get)
        addrs = [a for a, _ in table]
        for d, start in starts:
            if d != dso:
                continue
            i = bisect.bisect_right(addrs, start + delta) - 1
            while i >= 0 and re.search(GENERIC + r"|^<&T as core::", table[i][1]):
                i -= 1
            if i >= 0:
                result[start] = table[i][1]
    return result


def classify(frames, attention_closures, closure_owner):
    leaf = frames[0][0]
    if frames[0][2].startswith("[kernel"):
        for sym, _, dso in frames:
            if not dso.startswith("[kernel"):
                break
            if re.search(MEMORY_K, sym):
                return "memory (copies, allocation, page faults)"
            if re.search(HANDOFF_K, sym):
                return "thread hand-offs (rayon, futex, scheduler)"
        return "kernel (other)"
    if re.search(LEAF_MEMORY, leaf):
        return "memory (copies, allocation, page faults)"
    if re.search(LEAF_HANDOFF, leaf):
        return "thread hand-offs (rayon, futex, scheduler)"
    for sym, start, _ in frames:
        if start in attention_closures:
            return PARTS[0][0]
        sym = closure_owner.get(start, sym) if "call_" in sym else sym
        for part, pattern in PARTS:
            if re.search(pattern, sym):
                return part
        if not re.search(GENERIC, sym):
            return "other"
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    try:
        done = subprocess.run(
            ["perf", "script", "-i", args.data, "-F", "period,ip,sym,symoff,dso"],
            capture_output=True, text=True)
    except FileNotFoundError:
        raise SystemExit("perf_split.py: perf is not installed (apt-get install linux-perf)")
    if done.returncode != 0:
        raise SystemExit(f"perf_split.py: perf script -i {args.data} failed: {done.stderr.strip()}")
    report = done.stdout
    samples = list(frames_of(report))
    attention_closures = {
        frames[1][1] for _, frames in samples
        if len(frames) > 1 and "vec_dot_f32" in frames[0][0] and "call_mut" in frames[1][0]
    }
    closure_owner = owners(samples)
    total = sum(p for p, _ in samples) or 1
    parts, leaves = {}, {}
    for period, frames in samples:
        part = classify(frames, attention_closures, closure_owner)
        parts[part] = parts.get(part, 0) + period
        leaf = frames[0][0]
        if frames[0][1] in attention_closures:
            leaf = "closure in mistralrs_core::attention::backends::cpu::flash_attn_cpu"
        elif "call_" in leaf and frames[0][1] in closure_owner:
            leaf = f"closure in {closure_owner[frames[0][1]]}"
        key = (leaf, part)
        leaves[key] = leaves.get(key, 0) + period
    print(f"{len(samples)} samples ({args.data})\n")
    print("| part | share of samples |")
    print("|---|---|")
    for part, p in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"| {part} | {100 * p / total:.1f} % |")
    print("\n| top leaf symbols | counted as | share |")
    print("|---|---|---|")
    for (sym, part), p in sorted(leaves.items(), key=lambda kv: -kv[1])[: args.top]:
        short = sym if len(sym) <= 100 else sym[:97] + "..."
        print(f"| `{short}` | {part} | {100 * p / total:.1f} % |")


if __name__ == "__main__":
    main()
