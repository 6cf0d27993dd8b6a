//! Server configuration: a typed struct from `config/seeker.toml`, overridden by
//! `SEEKER_<SECTION>__<KEY>` environment variables, then by command-line flags.
//! Unknown keys are errors. Relative paths are relative to the working directory.
//!
//! This module holds [`Config`], [`ConfigError`], [`Config::load`] and
//! `validate`, which runs each section's checks; the sections live in `server`,
//! `model`, `search`, `pages` and `policy` (`[policy]` and `[generation]`),
//! the environment handling in `env`. Everything is re-exported here, so
//! callers write `crate::config::X`.

use std::path::{Path, PathBuf};

use figment::providers::{Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

mod env;
mod model;
mod pages;
mod policy;
mod search;
mod server;

pub use model::{
    ActivationDtype, EngineKind, Isq, ModelConfig, WeightFormat, DEFAULT_GGUF, DEFAULT_MODEL_ID,
    SMALL_GGUF,
};
pub use pages::PagesConfig;
pub use policy::{GenerationConfig, PolicyConfig};
pub use search::{
    BackendConfig, BackendKind, DenseConfig, SearchConfig, DEFAULT_APPROXIMATE_ABOVE,
    DEFAULT_ENCODER, DEFAULT_INDEX, DEFAULT_RESCORE,
};
pub use server::{ServerConfig, MAX_LIMIT};

/// The default config file, used when it exists and no `--config` is given.
pub const DEFAULT_CONFIG_FILE: &str = "config/seeker.toml";

/// The whole configuration.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[server]`: listening, API keys, limits.
    pub server: ServerConfig,
    /// `[model]`: the policy model and its engine.
    pub model: ModelConfig,
    /// `[search]`: the index, backends and dispatcher settings.
    pub search: SearchConfig,
    /// `[policy]`: the protocol profiles.
    pub policy: PolicyConfig,
    /// `[generation]`: request token budgets.
    pub generation: GenerationConfig,
    /// `[pages]`: the page reader.
    pub pages: PagesConfig,
}

/// Config loading failed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file given with `--config` does not exist.
    #[error("config file {0} not found")]
    NotFound(PathBuf),
    /// The path given with `--config` is not a file (a directory, say).
    #[error("config file {0} is not a file")]
    NotAFile(PathBuf),
    /// A file or variable that does not parse (unknown key, wrong type), or
    /// a value a section's check refuses; the message names the key.
    #[error("invalid configuration: {0}")]
    Invalid(String),
    /// A `SEEKER_<SECTION>__<KEY>` variable that names no setting or holds a
    /// value of the wrong type.
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
}

impl Config {
    /// Loads defaults, then `file` (or [`DEFAULT_CONFIG_FILE`] if it exists),
    /// then `SEEKER_<SECTION>__<KEY>` variables from `env`, each parsed as the
    /// type of the setting it names.
    ///
    /// # Errors
    /// A named file that does not exist, unknown keys, wrong types (with the
    /// file or variable and the key).
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        match file {
            Some(path) if !path.exists() => return Err(ConfigError::NotFound(path.into())),
            Some(path) if !path.is_file() => return Err(ConfigError::NotAFile(path.into())),
            Some(path) => figment = figment.merge(Toml::file_exact(path)),
            None if Path::new(DEFAULT_CONFIG_FILE).is_file() => {
                figment = figment.merge(Toml::file_exact(DEFAULT_CONFIG_FILE));
            }
            None => {}
        }
        let (figment, from_env) = env::merge_vars(figment, env)?;
        let config: Config = figment
            .extract()
            .map_err(|e| ConfigError::Invalid(describe(e, &from_env)))?;
        config.validate()?;
        Ok(config)
    }

    /// Runs each section's checks. The order is the one the checks always
    /// had (pages, server, the remote engine, generation, search, the model's
    /// sizes), so the first error reported for an input stays the same.
    fn validate(&self) -> Result<(), ConfigError> {
        self.pages.validate()?;
        self.server.validate()?;
        self.model.validate_engine()?;
        self.generation.validate()?;
        self.search.validate()?;
        self.model.validate_limits()?;
        Ok(())
    }
}

/// Settings that earlier versions had, with what to do instead: the key
/// (a table covers its keys) and the hint said in its place.
const REMOVED: &[(&str, &str)] = &[
    (
        "search.dense.hnsw",
        "removed with the HNSW graph (dense indexes past search.dense.approximate_above \
         are searched by sign-bit codes now); delete it, and set search.dense.rescore for \
         recall against latency",
    ),
    (
        "search.dense.ef_search",
        "removed with the HNSW graph; search.dense.rescore (candidates scored exactly) \
         takes its place",
    ),
];

/// What to do instead of `key` (dotted), when it is a removed setting.
pub(crate) fn removed_setting(key: &str) -> Option<&'static str> {
    REMOVED.iter().find_map(|(removed, hint)| {
        (key == *removed || key.starts_with(&format!("{removed}."))).then_some(*hint)
    })
}

/// A figment error as one line per failure, `SOURCE: KEY: WHAT`, joined with
/// `; ` (no mention of figment). A key set by an environment variable
/// (`from_env`: dotted path and variable) names that variable as its source;
/// Rust's integer type names become their ranges.
fn describe(e: figment::Error, from_env: &[(String, String)]) -> String {
    e.into_iter()
        .map(|e| {
            let path = e.path.join(".");
            let source = from_env
                .iter()
                .rev()
                .find(|(p, _)| *p == path)
                .map(|(_, var)| format!("environment variable {var}: "))
                .or_else(|| {
                    e.metadata
                        .as_ref()
                        .and_then(|m| m.source.as_ref())
                        .map(|s| format!("{s}: "))
                })
                .unwrap_or_default();
            let key = if path.is_empty() {
                String::new()
            } else {
                format!("{path}: ")
            };
            match removed_setting(&path) {
                Some(hint) => format!("{source}{key}{hint}"),
                None => format!("{source}{key}{}", plain_ranges(&e.kind.to_string())),
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// "expected u16" and the like, said as the range a user can write.
fn plain_ranges(message: &str) -> String {
    [
        ("expected u8", "expected an integer from 0 to 255"),
        ("expected u16", "expected an integer from 0 to 65535"),
        ("expected u32", "expected an integer from 0 to 4294967295"),
    ]
    .iter()
    .fold(message.to_string(), |m, (rust, plain)| {
        m.replace(rust, plain)
    })
}

/// The environment variable `name` as a backend's key lookup reads it:
/// its value; a value that is not UTF-8 as one replacement character (so
/// the key checks refuse it by the variable's name, never printing it);
/// `None` when it is not set.
pub fn env_value(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(value) => Some(value),
        Err(std::env::VarError::NotUnicode(_)) => Some("\u{FFFD}".into()),
        Err(std::env::VarError::NotPresent) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_config_equals_the_defaults() {
        let file = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config/seeker.toml"));
        let config = Config::load(Some(file), []).unwrap();
        assert_eq!(config, Config::default());
    }

    #[test]
    fn a_removed_setting_says_what_replaced_it_in_a_file_and_in_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        for toml in [
            "[search.dense]\nef_search = 256\n",
            "[search.dense.hnsw]\nm = 16\n",
        ] {
            let file = dir.path().join("old.toml");
            std::fs::write(&file, toml).unwrap();
            let err = Config::load(Some(&file), []).unwrap_err().to_string();
            assert!(
                err.contains("removed with the HNSW graph") && err.contains("search.dense.rescore"),
                "{toml}: {err}"
            );
        }
        for var in [
            "SEEKER_SEARCH__DENSE__EF_SEARCH",
            "SEEKER_SEARCH__DENSE__HNSW__M",
        ] {
            let err = Config::load(None, [(var.to_string(), "16".to_string())])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(var) && err.contains("search.dense.rescore"),
                "{var}: {err}"
            );
        }
    }

    #[test]
    fn the_small_config_changes_only_the_model_and_the_profile() {
        let file = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config/small.toml"));
        let config = Config::load(Some(file), []).unwrap();
        assert_eq!(config.model.gguf, Path::new(SMALL_GGUF));
        assert_eq!(config.model.id, "SmolLM2-135M-Instruct");
        assert_eq!(config.policy.default, "search-r1-prefetch");
        let mut back = config.clone();
        back.model.gguf = DEFAULT_GGUF.into();
        back.model.id = DEFAULT_MODEL_ID.into();
        back.policy.default = "search-r1".into();
        assert_eq!(back, Config::default());
    }
}
