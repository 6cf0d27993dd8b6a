//! `[policy]` and `[generation]`: [`PolicyConfig`] (which protocol profile
//! serves a request) and [`GenerationConfig`] (a request's token budget and
//! its limit), with the latter's check. Used by `startup` (loading the
//! profiles) and `server` (request defaults).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// `[policy]`: which protocol profile serves requests.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Profile name (a file in `dir`).
    pub default: String,
    /// Directory of profile TOML files.
    pub dir: PathBuf,
    /// The profile a chat request with `tools` (or tool messages) runs when
    /// it names no policy and `default` cannot call functions; it must render
    /// functions through the chat template. Empty: such a request is a 400.
    pub tools: String,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            default: "search-r1".into(),
            dir: "config/policies".into(),
            tools: "tool-search".into(),
        }
    }
}

/// `[generation]`: request defaults and limits.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GenerationConfig {
    /// Token budget across all rounds when a request gives no `max_tokens`.
    pub max_tokens: usize,
    /// Largest `max_tokens` a request may ask for.
    pub max_tokens_limit: usize,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        Self {
            max_tokens: 512,
            max_tokens_limit: 8192,
        }
    }
}

impl GenerationConfig {
    /// Checks that both budgets are at least 1 and `max_tokens` is within
    /// `max_tokens_limit`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the keys.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_tokens == 0 || self.max_tokens_limit == 0 {
            return Err(ConfigError::Invalid(
                "generation.max_tokens and generation.max_tokens_limit must be at least 1".into(),
            ));
        }
        if self.max_tokens > self.max_tokens_limit {
            return Err(ConfigError::Invalid(
                "generation.max_tokens exceeds generation.max_tokens_limit".into(),
            ));
        }
        Ok(())
    }
}
