//! Server configuration: a typed struct from `config/seeker.toml`, overridden by
//! `SEEKER_<SECTION>__<KEY>` environment variables, then by command-line flags.
//! Unknown keys are errors. Relative paths are relative to the working directory.

use std::path::{Path, PathBuf};

use figment::providers::{Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

use crate::engine::mistral::ActivationDtype;

/// The default config file, used when it exists and no `--config` is given.
pub const DEFAULT_CONFIG_FILE: &str = "config/seeker.toml";

/// The whole configuration.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub model: ModelConfig,
    pub search: SearchConfig,
    pub policy: PolicyConfig,
    pub generation: GenerationConfig,
}

/// `[server]`: where to listen.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub host: String,
    /// 0 picks a free port (printed at startup).
    pub port: u16,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8080,
        }
    }
}

/// `[model]`: the embedded policy model.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Id served in `/v1/models` (the alias `default` also works).
    pub id: String,
    /// GGUF file with weights, tokenizer and chat template.
    pub gguf: PathBuf,
    /// Activation dtype; `f32` is the fastest on CPU (`../shared/DESIGN.md`).
    pub dtype: ActivationDtype,
    /// Sequences the engine runs at once.
    pub max_num_seqs: usize,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            id: "SmolLM2-135M-Instruct".into(),
            gguf: "models/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
            dtype: ActivationDtype::F32,
            max_num_seqs: 16,
        }
    }
}

/// `[search]`: the local BM25 index.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SearchConfig {
    /// Directory built by `seeker index`.
    pub index: PathBuf,
}

impl Default for SearchConfig {
    fn default() -> Self {
        Self {
            index: "data/wiki/index".into(),
        }
    }
}

/// `[policy]`: which protocol profile serves requests.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Profile name (a file in `dir`).
    pub default: String,
    /// Directory of profile TOML files.
    pub dir: PathBuf,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            default: "search-r1-prefetch".into(),
            dir: "config/policies".into(),
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

/// Config loading failed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {0} not found")]
    NotFound(PathBuf),
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// Loads defaults, then `file` (or [`DEFAULT_CONFIG_FILE`] if it exists),
    /// then `SEEKER_<SECTION>__<KEY>` variables from `env`.
    ///
    /// # Errors
    /// A named file that does not exist, unknown keys, wrong types.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        match file {
            Some(path) if !path.is_file() => return Err(ConfigError::NotFound(path.into())),
            Some(path) => figment = figment.merge(Toml::file_exact(path)),
            None if Path::new(DEFAULT_CONFIG_FILE).is_file() => {
                figment = figment.merge(Toml::file_exact(DEFAULT_CONFIG_FILE));
            }
            None => {}
        }
        // Only SEEKER_SECTION__KEY variables are configuration; other SEEKER_*
        // variables (SEEKER_BIN for scripts) are not.
        let vars: Vec<(String, String)> = env
            .into_iter()
            .filter_map(|(k, v)| {
                let rest = k.strip_prefix("SEEKER_")?;
                rest.contains("__")
                    .then(|| (rest.to_ascii_lowercase().replace("__", "."), v))
            })
            .collect();
        for (key, value) in vars {
            figment = figment.merge((key, parse_env_value(&value)));
        }
        let config: Config = figment
            .extract()
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.generation.max_tokens == 0 || self.generation.max_tokens_limit == 0 {
            return Err(ConfigError::Invalid(
                "generation.max_tokens and generation.max_tokens_limit must be at least 1".into(),
            ));
        }
        if self.generation.max_tokens > self.generation.max_tokens_limit {
            return Err(ConfigError::Invalid(
                "generation.max_tokens exceeds generation.max_tokens_limit".into(),
            ));
        }
        Ok(())
    }
}

/// Environment values are typed like TOML values: numbers and booleans parse,
/// anything else is a string.
fn parse_env_value(raw: &str) -> figment::value::Value {
    use figment::value::Value;
    if let Ok(n) = raw.parse::<i64>() {
        return Value::from(n);
    }
    if let Ok(b) = raw.parse::<bool>() {
        return Value::from(b);
    }
    Value::from(raw.to_string())
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
    fn env_overrides_and_unknown_keys() {
        let env = [
            ("SEEKER_SERVER__PORT".to_string(), "9000".to_string()),
            ("SEEKER_MODEL__ID".to_string(), "m".to_string()),
            ("SEEKER_BIN".to_string(), "ignored".to_string()),
        ];
        let config = Config::load(None, env).unwrap();
        assert_eq!(config.server.port, 9000);
        assert_eq!(config.model.id, "m");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, "[server]\nprot = 1\n").unwrap();
        let err = Config::load(Some(&file), []).unwrap_err().to_string();
        assert!(err.contains("prot"), "{err}");
        let err = Config::load(Some(&dir.path().join("missing.toml")), [])
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing.toml"), "{err}");
    }
}
