#!/usr/bin/env bash
# Runs seeker's tests on a fresh machine (Debian or Ubuntu):
# 1. fetches the default model, corpus and FanOutQA (scripts/fetch-defaults.sh), and
#    generates the small PhantomWiki universe (scripts/phantomwiki.sh --size 500);
# 2. installs Debian's `searx` package if `searx-run` is missing: the SearXNG
#    backend test runs a real, offline searx over the default corpus;
# 3. installs Debian's `prometheus` package if `prometheus` or `promtool` is
#    missing: tests/it/prometheus.rs evaluates ops/'s dashboard and rules on a
#    real Prometheus of its own on a free loopback port (on a machine with
#    systemd the package also starts its service on :9090; the test does not
#    use it);
# 4. installs the pinned `xllamacpp` wheel (a prebuilt llama.cpp server) into
#    target/llama-venv (scripts/llama-venv.sh): the remote-engine tests run
#    real llama.cpp servers;
# 5. without arguments, runs every test with cargo-nextest where `cargo nextest` is installed
#    (one process a test, scheduled on both cores as tests finish, the slowest first
#    (.config/nextest.toml): the suite ran in 1,394 s under nextest against 1,723 s under
#    `cargo test` on one machine, whose test binary waits for its slowest test before the
#    next binary starts), then the doctests with `cargo test --doc` (nextest does not run
#    them); else, or with arguments, `cargo test --locked` with the arguments given.
#    nextest builds the library, binary and test targets only: the examples (benchmarks and
#    probes, ~140 MB binaries each) are not linked for the tests, `cargo clippy
#    --all-targets` in CI compiles them, and scripts/api-tests.sh builds the one it runs;
# 6. without arguments, also the API contract tests (scripts/api-tests.sh:
#    the official `openai` Python client, the web UI in headless Chromium and
#    schemathesis, in a virtualenv; it installs Debian's `chromium` and
#    `chromium-driver` if they are missing, as searx is installed here).
#
# `scripts/test.sh --quick` instead builds without the embedded engine (`--no-default-features`:
# no mistral.rs to compile) and runs, with cargo-nextest where installed (else `cargo test`,
# with any arguments given), every test that needs neither the model nor the fetched data nor
# an external server; it fetches no data and installs nothing. The tests that do need them
# are listed as ignored ("needs data, the model or a server").
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ${1:-} == --quick ]]; then
    shift
    # Cargo.toml's [patch.crates-io] names the patched crates' folders, built or not.
    scripts/patch-candle.sh
    # One process a test under cargo-nextest, as below: the SIGKILL tests time their kills
    # against a build measured alone.
    if [ $# -eq 0 ] && cargo nextest --version >/dev/null 2>&1; then
        exec cargo nextest run --locked --no-default-features --no-fail-fast
    fi
    exec cargo test --locked --no-default-features "$@"
fi

scripts/fetch-defaults.sh --no-index
# The PhantomWiki universe of tests/it/phantomwiki.rs (seed 1, ~500 articles): installs
# SWI-Prolog (Debian swi-prolog-nox) and the pinned generator into target/phantomwiki-venv.
scripts/phantomwiki.sh --size 500 --no-index --strict

# apt_install PACKAGE WHY: installs a Debian package as root or through sudo,
# or exits saying what to run.
apt_install() {
    echo "installing Debian's $1 package ($2)"
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$1"
    elif command -v sudo >/dev/null 2>&1; then
        sudo apt-get update -qq
        sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$1"
    else
        echo "error: $1 is missing and this user cannot install packages;" >&2
        echo "       run: apt-get install -y --no-install-recommends $1" >&2
        exit 1
    fi
}

if ! command -v searx-run >/dev/null 2>&1; then
    apt_install searx "for the SearXNG backend test"
fi
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    apt_install prometheus "for the dashboard and rules test"
fi

SEEKER_LLAMA_PYTHON=$(scripts/llama-venv.sh)
export SEEKER_LLAMA_PYTHON

if [ $# -eq 0 ] && cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --locked --no-fail-fast --lib --bins --tests
    cargo test --locked --doc
else
    cargo test --locked "$@"
fi

if [ $# -eq 0 ]; then
    scripts/api-tests.sh
fi
