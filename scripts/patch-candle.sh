#!/usr/bin/env bash
# Puts candle-core 0.11.1 under mistral.rs: the embedded engine's quantized CPU kernels.
#
# mistralrs 0.8.1 (the newest mistral.rs in the crate registry) requires candle-core ^0.10.2,
# whose quantized matmul multiplies one activation row at a time against every weight column;
# candle-core 0.11.1 tiles rows and, on AVX512-VNNI CPUs, repacks Q4K/Q6K/Q8_0 weights for
# vpdpbusd (prefill 2.5-3x faster here, decode ~1.1x: bench/README.md, "candle 0.11's kernels").
# Cargo cannot point a registry crate at another registry version, so Cargo.toml's
# [patch.crates-io] points candle-core at the path this script fills:
#
#   .cache/patched/candle-core   candle-core 0.11.1 as the registry serves it (the .crate
#                                file fetched by cargo, its sha256 checked), with two lines of
#                                its Cargo.toml changed:
#                                - version 0.11.1 -> 0.10.99, so that mistralrs 0.8.1,
#                                  candle-nn and candle-transformers 0.10.2 (all ^0.10.2) take it;
#                                - safetensors 0.8 -> 0.7: candle-nn 0.10's errors convert from
#                                  0.7's error type only (candle-core uses no 0.8-only API).
#
# Nothing else of candle changes, and no code of candle is committed. Idempotent: a copy whose
# marker names this crate's sha256 and this script's edits is kept. Run by
# scripts/fetch-defaults.sh (so by both README commands) before anything builds; a plain
# `cargo build` on a clone where it never ran fails with "failed to read
# .../.cache/patched/candle-core/Cargo.toml". When mistral.rs publishes a release on candle 0.11
# (0.9), bump mistralrs and the candle crates in Cargo.toml, delete [patch.crates-io] and this
# script, and run `cargo update -p candle-core`.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.11.1
# sha256 of candle-core-0.11.1.crate: the checksum the crate registry's index gives it.
CRATE_SHA=d11c8be87cfbaef9ebb62fb3f850d1fc8e00cc1d11d393fdbe55a4d5c2cdb325
DEST=.cache/patched/candle-core
# The edits, as (old line, new line) pairs of the crate's normalised Cargo.toml.
MARKER="candle-core $VERSION $CRATE_SHA version=0.10.99 safetensors=0.7"

if [[ -f $DEST/.seeker-patch && $(cat "$DEST/.seeker-patch") == "$MARKER" && -f $DEST/Cargo.toml ]]; then
  echo "patch-candle: $DEST ok" >&2
  exit 0
fi

command -v cargo >/dev/null 2>&1 || { echo "patch-candle: needs cargo" >&2; exit 1; }
# cargo fetches the .crate into its registry cache: a throwaway package that depends on
# exactly this version, with its own lock file, so the project's lock stays as it is.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src"
: >"$work/src/lib.rs"
cat >"$work/Cargo.toml" <<EOF
[package]
name = "seeker-fetch-candle"
version = "0.0.0"
edition = "2021"
[dependencies]
candle-core = "=$VERSION"
[workspace]
EOF
echo "patch-candle: fetching candle-core $VERSION with cargo" >&2
# Only this machine's target: cargo fetch would otherwise download every platform's crates.
cargo fetch --quiet --target "$(rustc -vV | sed -n 's/^host: //p')" --manifest-path "$work/Cargo.toml" >&2
crate=""
for f in "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/candle-core-$VERSION.crate; do
  [[ -f $f && $(sha256sum "$f" | cut -d' ' -f1) == "$CRATE_SHA" ]] && crate=$f
done
if [[ -z $crate ]]; then
  echo "patch-candle: no candle-core-$VERSION.crate with sha256 $CRATE_SHA in cargo's registry cache" >&2
  exit 1
fi

rm -rf "$DEST.tmp"
mkdir -p "$DEST.tmp"
tar -xzf "$crate" -C "$DEST.tmp" --strip-components=1
python3 - "$DEST.tmp/Cargo.toml" <<'PY'
import sys
path = sys.argv[1]
text = open(path, encoding="utf-8").read()
edits = [
    ('name = "candle-core"\nversion = "0.11.1"', 'name = "candle-core"\nversion = "0.10.99"'),
    ('[dependencies.safetensors]\nversion = "0.8.0"', '[dependencies.safetensors]\nversion = "0.7"'),
]
for old, new in edits:
    if text.count(old) != 1:
        sys.exit(f"patch-candle: {path} does not read as expected: {old!r}")
    text = text.replace(old, new)
open(path, "w", encoding="utf-8").write(text)
PY
echo "$MARKER" >"$DEST.tmp/.seeker-patch"
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
echo "patch-candle: wrote $DEST (candle-core $VERSION as 0.10.99)" >&2
