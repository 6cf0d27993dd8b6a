//! Per-request metrics from a rollout's events: time to first token and to
//! the first answer token, rollout duration, tokens and rounds; and, for a
//! request whose client left, the phase it left in
//! (`seeker_client_disconnects_total{phase}`).

use std::sync::Arc;
use std::time::Instant;

use crate::metrics::Metrics;
use crate::rollout::{RolloutEvent, RolloutOutcome};

/// One request's latency and token metrics, from its rollout events; if it
/// is dropped before [`Observer::finish`] or [`Observer::fail`], the client
/// left, and that is counted with the phase it left in.
pub(crate) struct Observer {
    metrics: Arc<Metrics>,
    started: Instant,
    first_token: bool,
    first_answer_token: bool,
    /// `before_first_token`, `decode` or `search`.
    phase: &'static str,
    done: bool,
}

impl Observer {
    pub fn new(metrics: Arc<Metrics>, started: Instant) -> Self {
        Self {
            metrics,
            started,
            first_token: false,
            first_answer_token: false,
            phase: "before_first_token",
            done: false,
        }
    }

    pub fn on_event(&mut self, event: &RolloutEvent) {
        let seconds = self.started.elapsed().as_secs_f64();
        match event {
            RolloutEvent::Reasoning(_) | RolloutEvent::Answer(_) => {
                if !self.first_token {
                    self.first_token = true;
                    self.metrics.time_to_first_token.observe(seconds);
                }
                if matches!(event, RolloutEvent::Answer(_)) && !self.first_answer_token {
                    self.first_answer_token = true;
                    self.metrics.time_to_first_answer_token.observe(seconds);
                }
                self.phase = "decode";
            }
            RolloutEvent::Search { .. } | RolloutEvent::OpenPage(_) => self.phase = "search",
            // After a splice the engine runs again; the question search's
            // splice comes before any token (its prefill is still ahead).
            RolloutEvent::Splice(_) if self.first_token => self.phase = "decode",
            RolloutEvent::Splice(_) => self.phase = "before_first_token",
            RolloutEvent::Results(_) | RolloutEvent::RoundEnd { .. } => {}
        }
    }

    pub fn finish(&mut self, outcome: &RolloutOutcome) {
        self.done = true;
        let m = &self.metrics;
        m.rollout_duration
            .observe(self.started.elapsed().as_secs_f64());
        m.prompt_tokens.inc_by(outcome.usage.prompt_tokens as u64);
        m.generated_tokens
            .inc_by(outcome.usage.completion_tokens as u64);
        let rounds = outcome.rounds.iter().filter(|r| r.round > 0).count();
        m.rollout_rounds.observe(rounds as f64);
    }

    pub fn fail(&mut self) {
        self.done = true;
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        if !self.done {
            self.metrics
                .client_disconnects
                .with_label_values(&[self.phase])
                .inc();
            tracing::info!(phase = self.phase, "client left; request cancelled");
        }
    }
}
