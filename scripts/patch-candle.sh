#!/usr/bin/env bash
# Puts candle-core 0.11.1 under mistral.rs (the embedded engine's quantized CPU kernels) and
# gives mistral.rs's CPU attention grouped-head matmuls instead of a scalar loop per row.
#
# mistralrs 0.8.1 (the newest mistral.rs in the crate registry) requires candle-core ^0.10.2,
# whose quantized matmul multiplies one activation row at a time against every weight column;
# candle-core 0.11.1 tiles rows and, on AVX512-VNNI CPUs, repacks Q4K/Q6K/Q8_0 weights for
# vpdpbusd. Cargo cannot point a registry crate at another registry version, so Cargo.toml's
# [patch.crates-io] points candle-core and mistralrs-core at the paths this script fills:
#
#   .cache/patched/candle-core     candle-core 0.11.1 as the registry serves it (the .crate
#                                  file fetched by cargo, its sha256 checked), with
#                                  - version 0.11.1 -> 0.10.99 in its Cargo.toml, so that
#                                    mistralrs 0.8.1, candle-nn and candle-transformers 0.10.2
#                                    (all ^0.10.2) take it;
#                                  - safetensors 0.8 -> 0.7: candle-nn 0.10's errors convert
#                                    from 0.7's error type only (candle-core uses no 0.8 API);
#                                  - on CPUs with plain AVX2 (no VNNI) only: seeker's Q4K/Q6K
#                                    tile kernels (scripts/patches/candle_avx2.rs, included
#                                    into quantized/repack_x86.rs) and decode steps against
#                                    Q4K through the unpacked dot product.
#   .cache/patched/mistralrs-core  mistralrs-core 0.8.1 as the registry serves it (sha256
#                                  checked), with scripts/patches/cpu_attention.rs (seeker's own
#                                  code) added as src/attention/seeker_cpu.rs and called first
#                                  for CPU attention: grouped-head matmuls for prompts and decode
#                                  steps alike, where mistral.rs ran a scalar loop per row;
#                                  and its build script no longer asks to rerun on a
#                                  .git/HEAD this copy lacks (it rebuilt the crate each build).
#
# bench/README.md ("candle 0.11's kernels") measures each; docs/kernels.md says why and how to
# drop them. Nothing else changes, and no code of candle or mistral.rs is committed. Idempotent:
# a copy whose marker names its crate's sha256 and this script's edits, and whose files are as
# the script wrote them (a sha256 over them, .seeker-tree), is kept; any other is written
# again. Run by
# scripts/fetch-defaults.sh (so by both README commands) before anything builds; a plain
# `cargo build` on a clone where it never ran fails with "failed to read
# .../.cache/patched/candle-core/Cargo.toml". When mistral.rs publishes a release on candle 0.11
# (0.9), bump mistralrs and the candle crates in Cargo.toml, drop candle-core from
# [patch.crates-io] and run `cargo update -p candle-core`; drop mistralrs-core once its own CPU
# attention is no slower than this one.
set -euo pipefail
cd "$(dirname "$0")/.."

# fetch NAME VERSION SHA256 DEST: the registry's NAME-VERSION.crate, fetched by cargo into its
# cache (a throwaway package that depends on exactly this version, with its own lock file, so
# the project's lock stays as it is), checked by sha256 and unpacked into DEST.tmp.
fetch() {
  local name=$1 version=$2 sha=$3 dest=$4 work crate="" f
  command -v cargo >/dev/null 2>&1 || { echo "patch-candle: needs cargo" >&2; exit 1; }
  work=$(mktemp -d)
  mkdir -p "$work/src"
  : >"$work/src/lib.rs"
  cat >"$work/Cargo.toml" <<TOML
[package]
name = "seeker-fetch-$name"
version = "0.0.0"
edition = "2021"
[dependencies]
$name = "=$version"
[workspace]
TOML
  echo "patch-candle: fetching $name $version with cargo" >&2
  # Only this machine's target: cargo fetch would otherwise download every platform's crates.
  cargo fetch --quiet --target "$(rustc -vV | sed -n 's/^host: //p')" \
    --manifest-path "$work/Cargo.toml" >&2
  rm -rf "$work"
  for f in "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$name-$version.crate"; do
    [[ -f $f && $(sha256sum "$f" | cut -d' ' -f1) == "$sha" ]] && crate=$f
  done
  if [[ -z $crate ]]; then
    echo "patch-candle: no $name-$version.crate with sha256 $sha in cargo's registry cache;" >&2
    echo "  delete ${CARGO_HOME:-$HOME/.cargo}/registry/cache/*/$name-$version.crate and run this again" >&2
    exit 1
  fi
  rm -rf "$dest.tmp"
  mkdir -p "$dest.tmp"
  # A first copy keeps the files' own dates; one that replaces an earlier copy (changed or
  # damaged) is dated now, so cargo rebuilds from it whatever the earlier copy held.
  local touch=()
  [[ -e $dest ]] && touch=(--touch)
  tar "${touch[@]}" -xzf "$crate" -C "$dest.tmp" --strip-components=1
}

# tree DEST: one sha256 over every file of DEST but its markers (names and contents).
tree() {
  (cd "$1" && find . -type f ! -name .seeker-patch ! -name .seeker-tree -print0 | LC_ALL=C sort -z |
    xargs -0 sha256sum) | sha256sum | cut -d' ' -f1
}

# edit FILE OLD NEW [OLD NEW ...]: each OLD occurs exactly once in FILE and becomes NEW.
edit() {
  python3 -c '
import sys
path, pairs = sys.argv[1], sys.argv[2:]
text = open(path, encoding="utf-8").read()
for old, new in zip(pairs[::2], pairs[1::2]):
    if text.count(old) != 1:
        sys.exit(f"patch-candle: {path} does not read as expected: {old!r}")
    text = text.replace(old, new)
open(path, "w", encoding="utf-8").write(text)
' "$@"
}

# current DEST MARKER: whether DEST holds this crate with these edits already: its marker,
# and its files as they were written (a copy edited or damaged since is written again).
current() {
  [[ -f $1/.seeker-patch && $(cat "$1/.seeker-patch") == "$2" && -f $1/.seeker-tree &&
    $(cat "$1/.seeker-tree") == "$(tree "$1")" ]]
}

# finish DEST MARKER: the edited DEST.tmp, marked, replaces DEST.
finish() {
  echo "$2" >"$1.tmp/.seeker-patch"
  tree "$1.tmp" >"$1.tmp/.seeker-tree"
  rm -rf "$1"
  mv "$1.tmp" "$1"
  echo "patch-candle: wrote $1" >&2
}

# candle-core 0.11.1 read as 0.10.99. The sha256 of each .crate is the checksum the crate
# registry's index gives it.
DEST=.cache/patched/candle-core
SHA=d11c8be87cfbaef9ebb62fb3f850d1fc8e00cc1d11d393fdbe55a4d5c2cdb325
OURS=scripts/patches/candle_avx2.rs
MARKER="candle-core 0.11.1 $SHA version=0.10.99 safetensors=0.7 avx2=$(sha256sum $OURS | cut -c1-16) q4k-gemv-avx2=unpacked"
if current $DEST "$MARKER"; then
  echo "patch-candle: $DEST ok" >&2
else
  fetch candle-core 0.11.1 $SHA $DEST
  # The crate's normalised Cargo.toml.
  edit "$DEST.tmp/Cargo.toml" \
    $'name = "candle-core"\nversion = "0.11.1"' $'name = "candle-core"\nversion = "0.10.99"' \
    $'[dependencies.safetensors]\nversion = "0.8.0"' $'[dependencies.safetensors]\nversion = "0.7"'
  # On plain AVX2 (no VNNI): the repacked Q4K/Q6K tile kernels from candle_avx2.rs (seeker's
  # own, i16 sums; bit-identical results, prefill 1.2-1.3x), and one activation row (a
  # decode step) against Q4K weights through k_quants' unpacked vec_dot instead of the tiles,
  # which carry a third more bytes a weight (decode ~1.2x). bench/README.md, "AVX2 kernels".
  cp $OURS "$DEST.tmp/src/quantized/seeker_avx2.rs"
  edit "$DEST.tmp/src/quantized/repack_x86.rs" \
    $'        D::Q4K => true,\n' \
    $'        // seeker: a decode step on plain AVX2 reads the compact weights (patch-candle.sh)\n        D::Q4K => m > 1 || lv != X86Level::Avx2,\n' \
    $'    // dpbusd stand-in for pure AVX2: maddubs (u8 x i8 -> i16 pairs) then madd against ones.\n    #[target_feature(enable = "avx2")]\n    unsafe fn dp_avx2(acc: __m256i, w_u8: __m256i, a_i8: __m256i) -> __m256i {\n        let prod16 = _mm256_maddubs_epi16(w_u8, a_i8);\n        _mm256_add_epi32(acc, _mm256_madd_epi16(prod16, _mm256_set1_epi16(1)))\n    }\n\n' \
    '' \
    $'    q4k_tile_256!(q4k_tile_avx2, dp_avx2, "avx2,fma");\n' \
    '' \
    $'    q6k_tile_256!(q6k_tile_avx2, dp_avx2, "avx2,fma");\n' \
    $'    // seeker: the plain-AVX2 kernels (patch-candle.sh)\n    include!("seeker_avx2.rs");\n'
  finish $DEST "$MARKER"
fi

# mistralrs-core 0.8.1 with seeker's CPU attention.
DEST=.cache/patched/mistralrs-core
SHA=a2b8b9e5c94491d9ceeded3a30291cb6af6ae74810a5776dd55e3bbb8b3429d4
OURS=scripts/patches/cpu_attention.rs
MARKER="mistralrs-core 0.8.1 $SHA cpu-attention=$(sha256sum $OURS | cut -c1-16) build-rs=no-git-rerun"
if current $DEST "$MARKER"; then
  echo "patch-candle: $DEST ok" >&2
else
  fetch mistralrs-core 0.8.1 $SHA $DEST
  cp $OURS "$DEST.tmp/src/attention/seeker_cpu.rs"
  edit "$DEST.tmp/src/attention/mod.rs" \
    $'mod backends;\n' \
    $'mod backends;\nmod seeker_cpu;\n' \
    $'        let can_use_flash = q.device().is_cpu()\n' \
    $'        // seeker: on the CPU, grouped-head matmuls first (seeker_cpu.rs)\n        if q.device().is_cpu() {\n            if let Some(out) = seeker_cpu::grouped_sdpa(q, k, v, mask, sdpa_params)? {\n                return Ok(out);\n            }\n        }\n\n        let can_use_flash = q.device().is_cpu()\n'
  # Its build script asks to rerun when .git/HEAD changes, a file this copy never has:
  # Cargo then reran it, and rebuilt the crate, on every build (~8 minutes a release build).
  edit "$DEST.tmp/build.rs" \
    $'    println!("cargo:rerun-if-changed=.git/HEAD");\n' \
    $'    // seeker (patch-candle.sh): no rerun-if-changed on .git/HEAD, which this copy lacks.\n'
  finish $DEST "$MARKER"
fi
