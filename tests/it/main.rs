//! Integration tests, one binary (it links mistral.rs once).
//! - `rollout`: the search loop with a scripted engine and an in-memory backend.
//! - `protocols`: every shipped profile through the loop: golden two-round
//!   transcripts, one test per failure kind of search-loop implementations.
//! - `splice`: every profile's splices against golden files written by the
//!   policies' reference code (`tests/fixtures/splices/make_fixtures.py`).
//! - `tools`: tool-calling profiles through the loop: every call form, splits
//!   at every byte, calls and query arrays searched at once, malformed calls.
//! - `pages`: the page reader against a local page server (one allowed
//!   fetch, every refusal, capped bodies) and ASearcher's `<access>` through
//!   the loop.
//! - `backends`: the dispatcher and every search backend (tantivy index, web
//!   APIs against fake servers, a real searx, the retriever protocol).
//! - `prometheus`: `ops/`'s Grafana dashboard and Prometheus rules evaluated
//!   by a real Prometheus scraping the real binary.
//! - `web`: every web search provider's shape and errors against an
//!   in-test server, through the config, the dispatcher and the real
//!   binary; `fallback` and `merge`; keys kept out of every output.
//! - `client_tools`: functions the client runs (`tools`, `tool_calls`, `tool`
//!   messages) through the router.
//! - `http`: the API surface through the router, no model needed.
//! - `mcp`: `/mcp` through the router: the MCP exchange, both tools, and
//!   the transport's refusals in the API's error shape.
//! - `responses`: `/v1/responses` through the router: items, the event
//!   sequence, citations, errors in the Responses request's terms.
//! - `ops`: keys, CORS, limits, deadlines, shutdown, cancellation, metrics over TCP.
//! - `prepare`: weight copies of the default GGUF (`seeker model prepare`).
//! - `remote`: the remote engine against real llama.cpp servers (xllamacpp)
//!   and against in-test servers that fail.
//! - `stops`: in-test servers that hand back the stop string they stopped at
//!   as llama-server, vLLM and SGLang do, fail to read it back, or write past
//!   `max_tokens`, through the real binary.
//! - `startup`: the real binary started, loaded, and stopped by signals while
//!   requests arrive; `seeker index` and `seeker eval` stopped by signals.
//! - `interrupted`: `seeker index` (BM25 and dense) killed with SIGKILL at
//!   random instants; the old or the new index is always served.
//! - `faults`: faults found by attacking the running server, through the real
//!   binary and model.
//! - `e2e`: the real binary, the real small GGUF (SmolLM2) and the default
//!   corpus (fetch them first with `scripts/fetch-defaults.sh --no-index`).
//! - `phantomwiki`: a generated PhantomWiki universe indexed, served on the
//!   default model and scored by `seeker eval` (make it first with
//!   `scripts/phantomwiki.sh --size 500 --no-index`).
//! - `qwen`: the default model (Qwen2.5-Coder-1.5B) against llama.cpp on the
//!   same GGUF (prompt, token ids, log-probabilities, end of turn), and end to
//!   end through the binary on the default config.
//! - `checkpoint`: a Hugging Face checkpoint made from the default GGUF
//!   (`scripts/hf-from-gguf.sh`) against the GGUF path (prompt, token ids,
//!   end ids, log-probabilities), served by the real binary quantized in
//!   memory, and bad checkpoint directories refused at startup.
//! - `common`: shared helpers.
//!
//! `SEEKER_TEST_BIN=PATH` runs the real-binary tests against another build.
//!
//! Built without the `embedded` feature (`scripts/test.sh --quick`), `qwen`,
//! `checkpoint` and `reuse`, which load the embedded engine in the test
//! process, are not compiled, and every test that needs the embedded engine
//! in the binary, the fetched data or an external server is ignored, with
//! "needs data, the model or a server" as its reason.

mod backends;
#[cfg(feature = "embedded")]
mod checkpoint;
mod client_tools;
mod common;
mod dense;
mod e2e;
mod faults;
mod http;
mod interrupted;
mod mcp;
mod ops;
mod pages;
mod phantomwiki;
mod prepare;
mod prometheus;
mod protocols;
#[cfg(feature = "embedded")]
mod qwen;
mod remote;
mod responses;
#[cfg(feature = "embedded")]
mod reuse;
mod rollout;
mod splice;
mod startup;
mod stops;
mod tools;
mod web;
