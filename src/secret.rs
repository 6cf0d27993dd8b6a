//! Credentials held in configuration and request settings.
//!
//! A [`Secret`] is an API key as seeker holds it: `Debug` prints
//! `[redacted]`, so a struct that carries one (the `[server]` config, the
//! remote engine's settings, `seeker eval`'s) can be logged or printed in an
//! error whole without leaking it. The key itself is read only where it is
//! sent or compared, through [`Secret::expose`].

use std::fmt;

use serde::{Deserialize, Serialize};

/// An API key. Serde reads and writes it as the plain string
/// (`#[serde(transparent)]`), so config files keep their shape; `Debug`
/// prints `[redacted]`.
#[derive(Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key, for the one place that sends or compares it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl From<String> for Secret {
    fn from(key: String) -> Self {
        Self(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_key_and_serde_keeps_it() {
        let key = Secret::new("sk-live-123");
        assert_eq!(format!("{key:?}"), "[redacted]");
        assert_eq!(
            format!("{:?}", Some(vec![key.clone()])),
            "Some([[redacted]])"
        );
        assert_eq!(key.expose(), "sk-live-123");
        let json = serde_json::to_string(&key).unwrap();
        assert_eq!(json, "\"sk-live-123\"");
        assert_eq!(serde_json::from_str::<Secret>(&json).unwrap(), key);
    }
}
