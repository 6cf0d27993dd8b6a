//! [`Gated`]: an engine behind a gate of N slots that serves rollouts in
//! arrival order.
//!
//! A generation waits for a slot *before* its request reaches the engine, and
//! holds it until its stream ends or its consumer drops it. Three things follow:
//! - A client that leaves while it waits costs the engine nothing: its
//!   request is never sent. (Sent straight to mistral.rs, the request of a
//!   stream closed at once waited in mistral.rs's queue and was still
//!   prefilled when its turn came — 24 such streams cost 216 CPU-seconds and
//!   delayed a real request to 117 s, seeker issue 18.)
//! - Waiting generations are served oldest rollout first
//!   ([`GenerationParams::session`] ids grow with arrival; a generation
//!   without one queues after every rollout), and in arrival order within the
//!   same rank. So the next round of a rollout already under way goes before
//!   any newer rollout's first round: with many clients, a long rollout is not
//!   starved by short requests arriving while it searches (mistral.rs's own
//!   scheduler runs the shortest waiting sequence first).
//! - The wait is measured (`seeker_engine_queue_wait_seconds`,
//!   `seeker_engine_queue_depth`) when the gate has metrics.
//!
//! A round that finishes its search while the slot is taken waits; the slot
//! is not reserved for it during the search (the engine would idle).
//!
//! The embedded engine is gated with `model.max_num_seqs` slots, the number of
//! sequences it runs at once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};

use super::{Engine, EngineError, Generation, GenerationParams};
use crate::metrics::Metrics;

/// See the module documentation.
pub struct Gated<E> {
    inner: E,
    queue: Arc<Queue>,
}

/// The slots and who waits for them.
struct Queue {
    state: Mutex<QueueState>,
    /// Arrival numbers of waiting generations (ties within a rank).
    arrivals: AtomicU64,
    metrics: Option<Arc<Metrics>>,
}

struct QueueState {
    free: usize,
    /// (rank, arrival) → the waiter's wake-up; the first entry goes next.
    waiting: BTreeMap<(u64, u64), oneshot::Sender<()>>,
}

/// A held slot; dropping it hands it to the next waiter, or frees it.
struct Slot(Arc<Queue>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl Queue {
    fn release(&self) {
        let mut state = self.state.lock().expect("gate lock");
        // Hand the slot over; a waiter that left meanwhile is skipped.
        while let Some((_, wake)) = state.waiting.pop_first() {
            if wake.send(()).is_ok() {
                self.depth(&state);
                return;
            }
        }
        state.free += 1;
        self.depth(&state);
    }

    fn depth(&self, state: &QueueState) {
        if let Some(m) = &self.metrics {
            m.engine_queue_depth.set(state.waiting.len() as i64);
        }
    }

    /// Waits for a slot, `rank` (lower first) then arrival order.
    async fn acquire(self: &Arc<Self>, rank: u64) -> Slot {
        let started = Instant::now();
        let (key, wake) = {
            let mut state = self.state.lock().expect("gate lock");
            if state.free > 0 && state.waiting.is_empty() {
                state.free -= 1;
                drop(state);
                self.waited(started);
                return Slot(Arc::clone(self));
            }
            let key = (rank, self.arrivals.fetch_add(1, Ordering::Relaxed));
            let (tx, rx) = oneshot::channel();
            state.waiting.insert(key, tx);
            self.depth(&state);
            (key, rx)
        };
        // Leaving while waiting (the client left) takes the entry out.
        struct Waiting<'a>(&'a Queue, (u64, u64), bool);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                if !self.2 {
                    let mut state = self.0.state.lock().expect("gate lock");
                    if state.waiting.remove(&self.1).is_none() {
                        // Handed a slot just as it left: pass it on.
                        drop(state);
                        self.0.release();
                    } else {
                        self.0.depth(&state);
                    }
                }
            }
        }
        let mut waiting = Waiting(self, key, false);
        let _ = wake.await;
        waiting.2 = true;
        self.waited(started);
        Slot(Arc::clone(self))
    }

    fn waited(&self, started: Instant) {
        if let Some(m) = &self.metrics {
            m.engine_queue_wait.observe(started.elapsed().as_secs_f64());
        }
    }
}

impl<E: Engine> Gated<E> {
    /// `inner` running at most `slots` generations at once (at least 1).
    pub fn new(inner: E, slots: usize) -> Self {
        Self {
            inner,
            queue: Arc::new(Queue {
                state: Mutex::new(QueueState {
                    free: slots.max(1),
                    waiting: BTreeMap::new(),
                }),
                arrivals: AtomicU64::new(0),
                metrics: None,
            }),
        }
    }

    /// Records the queue's wait and depth in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        Arc::get_mut(&mut self.queue)
            .expect("not shared before use")
            .metrics = Some(metrics);
        self
    }
}

#[async_trait]
impl<E: Engine> Engine for Gated<E> {
    fn healthy(&self) -> bool {
        self.inner.healthy()
    }

    /// Waits for a slot, oldest rollout first (dropping this future while it
    /// waits leaves no trace in the engine), then starts the inner
    /// generation; the slot is given back when the stream ends or the
    /// returned receiver is dropped.
    ///
    /// # Errors
    /// As the inner engine's.
    async fn generate(
        &self,
        prompt: &str,
        params: &GenerationParams,
    ) -> Result<Generation, EngineError> {
        let slot = self.queue.acquire(params.session.unwrap_or(u64::MAX)).await;
        let mut inner = self.inner.generate(prompt, params).await?;
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            let _slot = slot;
            loop {
                let event = tokio::select! {
                    // The consumer left: drop the inner stream (cancels it).
                    () = tx.closed() => return,
                    event = inner.events.recv() => event,
                };
                match event {
                    Some(event) => {
                        if tx.send(event).await.is_err() {
                            return;
                        }
                    }
                    None => return,
                }
            }
        });
        Ok(Generation {
            prompt_tokens: inner.prompt_tokens,
            events: rx,
        })
    }
}
