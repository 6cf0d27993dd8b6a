//! Integration tests, one binary (it links mistral.rs once).
//! - `rollout`: the search loop with a scripted engine and an in-memory backend.
//! - `http`: the API surface through the router, no model needed.
//! - `ops`: keys, CORS, limits, deadline, shutdown, cancellation, metrics over TCP.
//! - `startup`: the real binary started, loaded, and stopped by signals while
//!   requests arrive; `seeker index` and `seeker eval` stopped by signals.
//! - `faults`: faults found by attacking the running server, through the real
//!   binary and model.
//! - `e2e`: the real binary, the real default GGUF and corpus (fetch them first
//!   with `scripts/fetch-defaults.sh --no-index`).

mod backends;
mod common;
mod e2e;
mod faults;
mod http;
mod ops;
mod prepare;
mod protocols;
mod rollout;
mod splice;
mod startup;
