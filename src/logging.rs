//! The log setup of the `seeker` binary: `RUST_LOG` (or seeker's default
//! levels) on standard error, less the engine's report of the step that
//! empties the prefix cache on purpose (`engine::mistral::reuse_state::flush`): mistral.rs
//! logs every failed forward pass at ERROR, and that one is no fault.

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

#[cfg(feature = "embedded")]
pub use flush::NotTheFlushStep;

/// Default levels when `RUST_LOG` is unset. mistral.rs's GGUF loader warns
/// "a mix of GPU and CPU" on every CPU-only load, which misleads on machines
/// without a GPU.
const DEFAULT: &str = "seeker=info,tower_http=info,mistralrs_core::pipeline::gguf=error,warn";

/// Installs the global subscriber (colour codes only on a terminal).
pub fn init() {
    let levels = EnvFilter::try_from_default_env().unwrap_or_else(|_| DEFAULT.into());
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(levels);
    #[cfg(feature = "embedded")]
    let layer = layer.with_filter(NotTheFlushStep);
    tracing_subscriber::registry().with(layer).init();
}

/// The embedded engine's flush-step filter (a build without it has no flush).
#[cfg(feature = "embedded")]
mod flush {
    use std::fmt::Debug;

    use tracing::field::{Field, Visit};
    use tracing::{Event, Metadata};
    use tracing_subscriber::layer::{Context, Filter};

    use crate::engine::mistral::FLUSH_ERROR_MARK;

    /// Drops mistral.rs's events that report the flush step's failure (they
    /// name [`FLUSH_ERROR_MARK`], the token id no vocabulary has).
    pub struct NotTheFlushStep;

    impl<S> Filter<S> for NotTheFlushStep {
        fn enabled(&self, _: &Metadata<'_>, _: &Context<'_, S>) -> bool {
            true
        }

        fn event_enabled(&self, event: &Event<'_>, _: &Context<'_, S>) -> bool {
            if !event.metadata().target().starts_with("mistralrs") {
                return true;
            }
            let mut found = Mentions(false);
            event.record(&mut found);
            !found.0
        }
    }

    /// Whether some field of an event mentions [`FLUSH_ERROR_MARK`].
    struct Mentions(bool);

    impl Visit for Mentions {
        fn record_debug(&mut self, _: &Field, value: &dyn Debug) {
            if format!("{value:?}").contains(FLUSH_ERROR_MARK) {
                self.0 = true;
            }
        }

        fn record_str(&mut self, _: &Field, value: &str) {
            if value.contains(FLUSH_ERROR_MARK) {
                self.0 = true;
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use crate::engine::mistral::{FLUSH_ERROR_MARK, FLUSH_TOKEN};

        #[test]
        fn the_mark_is_the_flush_token_written_out() {
            assert_eq!(FLUSH_ERROR_MARK, FLUSH_TOKEN.to_string());
        }
    }
}
