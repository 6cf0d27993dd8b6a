//! The remote engine's replica pool: each replica's health, readiness
//! probes, times to first token and slowness, and the choice of the replica
//! for a request.
//!
//! Seam: [`Inner::pick`] and [`Inner::done`] bracket every generation
//! (`request.rs` picks when it starts a round, `stream.rs` gives the replica
//! back when its stream ends); [`Inner::mark_down`] and [`Inner::mark_up`]
//! are called by the round's outcome (a refusal, a broken stream, a finish);
//! `mod.rs` builds the replicas ([`Replica::new`]), marks down those silent
//! at start and spawns [`probe_loop`]; the `Engine` impl reads
//! [`Inner::up_count`] for its health.
//!
//! Policy: a rollout stays on the replica that ran its first round (its
//! prefix is cached there; [`crate::engine::GenerationParams::session`])
//! while that replica is healthy and not slow (time to first token five
//! times the fastest other replica's); a new rollout goes to the healthy
//! replica with the fewest generations in flight, slow ones last, and of
//! replicas equal in both the one given a new rollout longest ago (so
//! rollouts that do not overlap still take turns). A replica
//! that refuses a connection, answers 5xx/408/429, breaks its stream or
//! stays silent past the read timeout is marked down (1 s, doubling to
//! 30 s; the kinds are [`FailureKind`]). A replica marked down counts as up
//! again only once a readiness probe succeeded (`GET /health`, then a
//! one-token completion: a server that is still busy with abandoned work,
//! or stopped, fails it); the probe runs when its time is up, from a
//! background task every [`PROBE_INTERVAL`] and before a request would use
//! it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{Inner, LOG_TARGET};

/// Longest time a replica stays marked down before it is probed again.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Deadline of a `/health` probe.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait for the one-token completion of a readiness probe (or the
/// read timeout, when shorter).
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the background task looks for replicas due for a probe.
const PROBE_INTERVAL: Duration = Duration::from_millis(250);

/// One server of the pool.
pub(super) struct Replica {
    /// Base URL without a trailing slash.
    pub(super) url: String,
    /// Generations streaming from it now.
    in_flight: AtomicUsize,
    /// When it last got a new placement (a value of `Inner::placements`;
    /// 0 = never): the tie-break among replicas equally loaded.
    last_placed: AtomicU64,
    health: Mutex<Health>,
    /// Its recent times to first token, for [`Inner::slow`].
    first_token: Mutex<FirstTokens>,
}

impl Replica {
    /// A replica at base URL `url` (no trailing slash), up, with nothing in
    /// flight.
    pub(super) fn new(url: String) -> Self {
        Self {
            url,
            in_flight: AtomicUsize::new(0),
            last_placed: AtomicU64::new(0),
            health: Mutex::new(Health::default()),
            first_token: Mutex::new(FirstTokens::default()),
        }
    }
}

/// A replica's times to first token over its last [`FIRST_TOKEN_ROUNDS`]
/// rounds within [`SLOW_MEMORY`] (seconds, with when each was measured).
#[derive(Default)]
struct FirstTokens(std::collections::VecDeque<(Instant, f64)>);

impl FirstTokens {
    fn push(&mut self, seconds: f64) {
        if self.0.len() == FIRST_TOKEN_ROUNDS {
            self.0.pop_front();
        }
        self.0.push_back((Instant::now(), seconds));
    }

    /// The recent times (within [`SLOW_MEMORY`]).
    fn recent(&self) -> impl Iterator<Item = f64> + '_ {
        self.0
            .iter()
            .filter(|(at, _)| at.elapsed() <= SLOW_MEMORY)
            .map(|&(_, s)| s)
    }
}

/// Rounds a replica's times to first token are kept for.
const FIRST_TOKEN_ROUNDS: usize = 8;
/// A replica is slow when its mean recent time to first token is this many
/// times the best recent time of the fastest other replica (and over
/// [`SLOW_FLOOR`]). The others' best, not their mean: a time to first token
/// grows with the prompt to prefill, and a healthy replica's best is what it
/// can do; on a loaded 2-core machine a healthy SmolLM2 server's mean was
/// 4.9 s while a replica stalled 12 s per request averaged 12.7 s.
const SLOW_FACTOR: f64 = 5.0;
/// Times to first token below this are never slow (noise on idle servers).
const SLOW_FLOOR: Duration = Duration::from_millis(500);
/// Times to first token count this long; after it a slow replica is tried
/// again (a new rollout may go to it), so one that recovered is used.
const SLOW_MEMORY: Duration = Duration::from_secs(30);

/// Whether a replica is marked down, and for how long.
#[derive(Default)]
struct Health {
    /// Failures in a row.
    failures: u32,
    /// Marked down until then.
    down_until: Option<Instant>,
}

/// Why a replica counts as failed: the `kind` label of
/// `seeker_engine_errors_total` and the `kind` field of the "marked down"
/// warning ([`FailureKind::label`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FailureKind {
    /// The replica could not be reached: a refused or failed connection, no
    /// answer to `GET /v1/models` at start, or a failed readiness probe.
    Connection,
    /// The replica answered with an error status: 5xx, 408 or 429 (a
    /// replica failure), or a 4xx that is the request's fault and no context
    /// overflow (counted, the replica not marked down).
    Status,
    /// The stream broke: a read error, malformed SSE or JSON, or an end
    /// (`[DONE]` or the connection closing) without a finish reason.
    Stream,
    /// The replica stayed silent past the read timeout, before its response
    /// headers or between two chunks.
    Timeout,
}

impl FailureKind {
    /// The label: `connection`, `status`, `stream` or `timeout`.
    pub(super) fn label(self) -> &'static str {
        match self {
            Self::Connection => "connection",
            Self::Status => "status",
            Self::Stream => "stream",
            Self::Timeout => "timeout",
        }
    }
}

/// Probes every replica whose time marked down is up, every
/// [`PROBE_INTERVAL`], until the engine is dropped: `/health` and the
/// replicas-up gauge then follow the replicas without waiting for a request.
pub(super) async fn probe_loop(inner: std::sync::Weak<Inner>) {
    loop {
        tokio::time::sleep(PROBE_INTERVAL).await;
        let Some(inner) = inner.upgrade() else { return };
        let now = Instant::now();
        let due: Vec<usize> = (0..inner.replicas.len())
            .filter(|&i| {
                inner
                    .replica(i)
                    .health
                    .lock()
                    .expect("health lock")
                    .down_until
                    .is_some_and(|t| t <= now)
            })
            .collect();
        futures::future::join_all(due.into_iter().map(|i| inner.usable(i))).await;
    }
}

impl Inner {
    pub(super) fn replica(&self, i: usize) -> &Replica {
        &self.replicas[i]
    }

    /// Replicas not marked down: never failed, or served or passed a
    /// readiness probe since they last failed. (A replica whose time marked
    /// down is over is not up until its probe succeeds.)
    pub(super) fn up_count(&self) -> i64 {
        self.replicas
            .iter()
            .filter(|r| r.health.lock().expect("health lock").down_until.is_none())
            .count() as i64
    }

    pub(super) fn mark_down(&self, i: usize, kind: FailureKind, message: &str) {
        let replica = self.replica(i);
        self.metrics
            .engine_errors
            .with_label_values(&[replica.url.as_str(), kind.label()])
            .inc();
        let backoff = {
            let mut h = replica.health.lock().expect("health lock");
            h.failures = h.failures.saturating_add(1);
            let backoff = Duration::from_secs(1 << (h.failures - 1).min(5)).min(MAX_BACKOFF);
            h.down_until = Some(Instant::now() + backoff);
            backoff
        };
        tracing::warn!(
            target: LOG_TARGET,
            replica = %replica.url,
            kind = kind.label(),
            error = %message,
            backoff_s = backoff.as_secs(),
            "engine replica failed; marked down"
        );
        self.metrics.engine_replicas_up.set(self.up_count());
    }

    pub(super) fn mark_up(&self, i: usize) {
        let mut h = self.replica(i).health.lock().expect("health lock");
        if h.failures > 0 || h.down_until.is_some() {
            *h = Health::default();
            drop(h);
            self.metrics.engine_replicas_up.set(self.up_count());
        }
    }

    /// Whether replica `i` may take a request now: not marked down, or its
    /// time is up and it passes [`Inner::ready`] (then it is marked up; a
    /// failed probe marks it down for longer).
    async fn usable(&self, i: usize) -> bool {
        let down_until = self
            .replica(i)
            .health
            .lock()
            .expect("health lock")
            .down_until;
        match down_until {
            None => true,
            Some(t) if Instant::now() < t => false,
            Some(_) => match self.ready(i).await {
                Ok(()) => {
                    self.mark_up(i);
                    true
                }
                Err(why) => {
                    self.mark_down(
                        i,
                        FailureKind::Connection,
                        &format!("readiness probe failed: {why}"),
                    );
                    false
                }
            },
        }
    }

    /// The readiness probe of replica `i`: `GET /health` answers 2xx within
    /// [`PROBE_TIMEOUT`], then a one-token greedy completion answers 2xx
    /// with a JSON body holding `choices` within [`READY_TIMEOUT`] (or the
    /// read timeout). The second half is
    /// what tells a server that is up from one that can serve: llama.cpp's
    /// `/health` says ok while its slots still finish generations whose
    /// clients left, and a new request waits behind them.
    async fn ready(&self, i: usize) -> Result<(), String> {
        let url = &self.replica(i).url;
        let health = self
            .client
            .get(format!("{url}/health"))
            .timeout(PROBE_TIMEOUT)
            .send()
            .await
            .map_err(|e| format!("GET /health: {e}"))?;
        if !health.status().is_success() {
            return Err(format!("GET /health: status {}", health.status()));
        }
        let mut request = self
            .client
            .post(format!("{url}/v1/completions"))
            .timeout(READY_TIMEOUT.min(self.read_timeout))
            .json(
                &json!({"model": self.model, "prompt": "OK", "max_tokens": 1,
                "temperature": 0.0, "stream": false}),
            );
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key.expose());
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("a one-token completion: {e}"))?;
        if !response.status().is_success() {
            return Err(format!(
                "a one-token completion: status {}",
                response.status()
            ));
        }
        let body: Value = response
            .json()
            .await
            .map_err(|e| format!("a one-token completion: {e}"))?;
        if !body["choices"].is_array() {
            return Err("a one-token completion without `choices`".into());
        }
        Ok(())
    }

    /// Records a round's time to first token on replica `i`.
    pub(super) fn first_token(&self, i: usize, seconds: f64) {
        self.replica(i)
            .first_token
            .lock()
            .expect("lock")
            .push(seconds);
    }

    /// Whether replica `i` is slow: its mean recent time to first token is
    /// over [`SLOW_FLOOR`] and [`SLOW_FACTOR`] times the best recent time of
    /// the fastest other replica that is up. A slow replica keeps its
    /// sessions only while no other can take them, and gets new rollouts
    /// last.
    fn slow(&self, i: usize) -> bool {
        let own: Vec<f64> = self
            .replica(i)
            .first_token
            .lock()
            .expect("lock")
            .recent()
            .collect();
        if own.is_empty() {
            return false;
        }
        let mean = own.iter().sum::<f64>() / own.len() as f64;
        if mean < SLOW_FLOOR.as_secs_f64() {
            return false;
        }
        let fastest_other = (0..self.replicas.len())
            .filter(|&j| j != i)
            .filter(|&j| {
                self.replica(j)
                    .health
                    .lock()
                    .expect("health lock")
                    .down_until
                    .is_none()
            })
            .flat_map(|j| {
                self.replica(j)
                    .first_token
                    .lock()
                    .expect("lock")
                    .recent()
                    .collect::<Vec<_>>()
            })
            .fold(f64::INFINITY, f64::min);
        mean > SLOW_FACTOR * fastest_other
    }

    /// The replica for the next request of `session`, not one of `tried`:
    /// the session's own replica when it is usable and not [slow](Inner::slow),
    /// else the usable one with the fewest generations in flight, slow ones
    /// last, and among equals the one placed on longest ago (turns). The
    /// pick counts as in flight at once, and is taken only if the replica's
    /// count is still what the choice saw (requests that arrive together
    /// spread over the replicas, even when they choose at the same instant);
    /// the caller gives it back with [`Inner::done`].
    pub(super) async fn pick(&self, session: Option<u64>, tried: &[usize]) -> Option<usize> {
        if let Some(session) = session {
            if let Some(i) = self.sessions.get(&session).await {
                if !tried.contains(&i) && !self.slow(i) && self.usable(i).await {
                    self.replica(i).in_flight.fetch_add(1, Ordering::Relaxed);
                    return Some(i);
                }
            }
        }
        loop {
            // Each replica with the generations in flight it had when
            // sorted: the pick takes a slot only if that is still so, so
            // two rollouts choosing at once cannot both take the idle one.
            let mut order: Vec<(usize, usize)> = (0..self.replicas.len())
                .filter(|i| !tried.contains(i))
                .map(|i| (i, self.replica(i).in_flight.load(Ordering::Acquire)))
                .collect();
            // Each key once (`slow` locks and reads every replica's times).
            order.sort_by_cached_key(|&(i, in_flight)| {
                (
                    self.slow(i),
                    in_flight,
                    self.replica(i).last_placed.load(Ordering::Relaxed),
                    i,
                )
            });
            let mut raced = false;
            for (i, seen) in order {
                if !self.usable(i).await {
                    continue;
                }
                let replica = self.replica(i);
                if replica
                    .in_flight
                    .compare_exchange(seen, seen + 1, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    // Another pick (or a finished generation) changed it:
                    // choose again from fresh counts.
                    raced = true;
                    break;
                }
                let stamp = self.placements.fetch_add(1, Ordering::Relaxed) + 1;
                replica.last_placed.store(stamp, Ordering::Relaxed);
                return Some(i);
            }
            if !raced {
                return None;
            }
        }
    }

    /// A generation picked on replica `i` ended (or never started).
    pub(super) fn done(&self, i: usize) {
        self.replica(i).in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_kinds_keep_their_metric_labels() {
        let labels = [
            FailureKind::Connection,
            FailureKind::Status,
            FailureKind::Stream,
            FailureKind::Timeout,
        ]
        .map(FailureKind::label);
        assert_eq!(labels, ["connection", "status", "stream", "timeout"]);
    }

    /// A pool of `n` replicas that are all up (nothing is ever sent to
    /// their URLs: `usable` asks no replica that is not marked down).
    fn pool(n: usize) -> Inner {
        Inner {
            client: reqwest::Client::new(),
            replicas: (0..n)
                .map(|i| Replica::new(format!("http://127.0.0.1:{}", 1000 + i)))
                .collect(),
            model: "m".into(),
            api_key: None,
            sessions: moka::future::Cache::new(100),
            placements: AtomicU64::new(0),
            read_timeout: Duration::from_secs(1),
            metrics: std::sync::Arc::new(crate::metrics::Metrics::new()),
            rounds: None,
            text_only: Default::default(),
            client_stops: Default::default(),
        }
    }

    #[tokio::test]
    async fn rollouts_that_overlap_go_to_the_least_loaded_replica() {
        let pool = pool(3);
        let mut picked = Vec::new();
        for _ in 0..3 {
            picked.push(pool.pick(None, &[]).await.unwrap());
        }
        assert_eq!(picked, [0, 1, 2]);
        // Replica 1 finishes first: the next rollout goes there.
        pool.done(1);
        assert_eq!(pool.pick(None, &[]).await, Some(1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn rollouts_choosing_at_the_same_instant_take_different_replicas() {
        for _ in 0..200 {
            let pool = std::sync::Arc::new(pool(3));
            let picks = (0..3).map(|_| {
                let pool = std::sync::Arc::clone(&pool);
                tokio::spawn(async move { pool.pick(None, &[]).await.unwrap() })
            });
            let mut picked: Vec<usize> = futures::future::join_all(picks)
                .await
                .into_iter()
                .map(Result::unwrap)
                .collect();
            picked.sort_unstable();
            assert_eq!(picked, [0, 1, 2]);
        }
    }

    #[tokio::test]
    async fn rollouts_one_after_another_take_turns() {
        let pool = pool(3);
        let mut picked = Vec::new();
        for _ in 0..7 {
            let i = pool.pick(None, &[]).await.unwrap();
            pool.done(i);
            picked.push(i);
        }
        assert_eq!(picked, [0, 1, 2, 0, 1, 2, 0]);
    }

    #[tokio::test]
    async fn a_rollout_stays_on_its_replica_and_a_down_one_is_skipped() {
        let pool = pool(2);
        pool.sessions.insert(7, 0).await;
        for _ in 0..3 {
            let i = pool.pick(Some(7), &[]).await.unwrap();
            pool.done(i);
            assert_eq!(i, 0, "the session's replica");
        }
        pool.mark_down(1, FailureKind::Connection, "test");
        let i = pool.pick(None, &[]).await.unwrap();
        pool.done(i);
        assert_eq!(i, 0, "replica 1 is marked down");
        assert_eq!(pool.pick(None, &[0]).await, None, "0 tried, 1 down");
    }
}
