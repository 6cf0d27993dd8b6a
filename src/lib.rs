//! seeker: an OpenAI-compatible inference server for search-augmented reasoning
//! policies (Search-R1, RAG-R1, R1-Searcher and models like them).
//!
//! The policy generates text; seeker watches it for search calls, runs the
//! queries against a search backend, splices the documents back in the exact
//! format the policy was trained on, and continues, streaming the reasoning,
//! the searches and the answer to the client.
//!
//! # Layout
//! - [`config`]: the typed server configuration (`config/seeker.toml`, env, flags).
//! - [`profile`]: policy profiles (`config/policies/*.toml`): prompt, tags,
//!   splice format, limits. Data, not code.
//! - [`template`]: the `{field}` templates profiles are written in.
//! - [`scanner`]: the tag scanner, a pure state machine over generated text.
//! - [`rollout`]: the search loop that drives one request round by round.
//! - [`engine`]: the [`engine::Engine`] trait; the embedded mistral.rs engine and
//!   a scripted engine for tests.
//! - [`search`]: the [`search::SearchBackend`] trait and the local tantivy BM25
//!   index ([`search::bm25`]).
//! - [`server`]: the axum HTTP surface (OpenAI chat completions, models, health).
//! - [`eval`]: `seeker eval`, EM / cover-EM / F1 and retrieval recall on QA sets.
//! - [`tempfiles`]: removal of temporary files that stopped processes left.

pub mod config;
pub mod engine;
pub mod eval;
pub mod metrics;
pub mod profile;
pub mod pyjson;
pub mod rollout;
pub mod scanner;
pub mod search;
pub mod server;
pub mod startup;
pub mod tempfiles;
pub mod template;
