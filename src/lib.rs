//! seeker: an OpenAI-compatible inference server for search-augmented reasoning
//! policies (Search-R1, RAG-R1, R1-Searcher and models like them).
//!
//! The policy generates text; seeker watches it for search calls, runs the
//! queries against a search backend, splices the documents back in the exact
//! format the policy was trained on, and continues, streaming the reasoning,
//! the searches and the answer to the client.
//!
//! # Layout
//!
//! A request's path, top to bottom (`main` → `startup` → `server` → `rollout` →
//! `profile` / `scanner` / `engine` / `search` → `metrics`); no module imports
//! one above it.
//!
//! - [`startup`]: the composition root: config → profiles, dispatcher, HTTP
//!   state, listener, the embedded engine loaded in the background; signals.
//! - [`server`]: the HTTP surface (axum), one file per step: `listen`
//!   (connections) → `ops` (keys, limits, per-route metrics) → `json` (the
//!   body) → `validate` → `chat` / `retrieve` → `render` (chunks, responses);
//!   `responses` (the Responses API over the same rollout), `mcp` (the MCP
//!   server), `citations` (`url_citation`s of an answer); `state`, `error`,
//!   `openai` (wire types), `api_doc` (OpenAPI).
//! - [`rollout`]: the search loop of one request, round by round; `answer`
//!   trims the streamed answer and applies `stop` strings.
//! - [`profile`]: policy profiles (`config/policies/*.toml`): `load` (schema and
//!   validation) and `text` (prompt, queries, splices, `defuse`). Data, not code.
//! - [`scanner`]: the tag scanner, a pure state machine over generated text.
//! - [`toolcall`]: tool calls in a finished turn (`<tool_call>` JSON, fenced
//!   or bare call objects), a pure function for tool-calling profiles.
//! - [`template`]: the `{field}` templates profiles are written in.
//! - [`pyjson`]: Python's `json.dumps` and `repr()` byte for byte (RAG-R1's
//!   splice, chat templates' `tojson`, DeepResearcher's tool results).
//! - [`engine`]: the [`engine::Engine`] trait; the embedded mistral.rs engine
//!   (`mistral`, `prepare` for weight copies), `gate` (engine slots, oldest rollout first)
//!   and `scripted` (a replaying engine for tests).
//! - [`search`]: the [`search::SearchBackend`] trait; `dispatch` (every query of
//!   a round at once: limits, retries, shared cache), `bm25` (the local tantivy
//!   index), `web` (Bing v7 shape, SearXNG), `retriever` (the Search-R1
//!   retriever protocol), `clean` (snippet clean-up), `setup` (from config).
//! - [`pages`]: page actions: `guard` (what may be fetched: schemes, hosts,
//!   every resolved address) and `reader` (fetch, readable text, cache; corpus
//!   documents by id or title).
//! - [`metrics`]: every Prometheus metric, one registry per server.
//! - [`config`]: the typed configuration (`config/seeker.toml`, env, flags).
//! - [`eval`]: `seeker eval`: `dataset` loading, EM / cover-EM / F1 and
//!   retrieval recall (`metrics`), the run itself (`job`).
//! - [`tempfiles`]: removal of temporary files that stopped processes left.
//!
//! The protocols the code relies on, with their sources, are in
//! `docs/protocols.md`.

pub mod config;
pub mod engine;
pub mod eval;
pub mod logging;
pub mod metrics;
pub mod pages;
pub mod profile;
pub mod pyjson;
pub mod rollout;
pub mod scanner;
pub mod search;
pub mod server;
pub mod startup;
pub mod tempfiles;
pub mod template;
pub mod toolcall;
