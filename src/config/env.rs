//! The `SEEKER_<SECTION>__<KEY>` environment variables ([`merge_vars`]): each
//! names a setting by its path (`SEEKER_SEARCH__DENSE__MODEL` is
//! `search.dense.model`) and is parsed as that setting's type. Used by
//! [`Config::load`] only.

use figment::Figment;

use super::{Config, ConfigError};

/// `figment` with each `SEEKER_<SECTION>__<KEY>` variable of `env` merged on
/// top, parsed as the type of the setting it names; other variables are
/// skipped. Also returns, per merged setting, its dotted path and the
/// variable that set it (so a later error can name the variable).
///
/// # Errors
/// [`ConfigError::Env`] for the first variable that names no setting or holds
/// a value of the wrong type.
pub(super) fn merge_vars(
    mut figment: Figment,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<(Figment, Vec<(String, String)>), ConfigError> {
    let mut set = Vec::new();
    let defaults = serde_json::to_value(Config::default()).expect("config serialises");
    // Only SEEKER_SECTION__KEY variables are configuration; other SEEKER_*
    // variables (SEEKER_BIN for scripts, SEEKER_API_KEY for eval) are not.
    for (var, raw) in env {
        let Some(rest) = var.strip_prefix("SEEKER_") else {
            continue;
        };
        // SECTION__KEY, or deeper: SEARCH__DENSE__MODEL is search.dense.model.
        let path: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
        if path.len() < 2 {
            continue;
        }
        let default = path.iter().fold(&defaults, |v, part| &v[part.as_str()]);
        if let Some(hint) = super::removed_setting(&path.join(".")) {
            return Err(ConfigError::Env {
                var,
                message: hint.into(),
            });
        }
        let value = env_value(default, &raw).map_err(|message| ConfigError::Env {
            var: var.clone(),
            message,
        })?;
        figment = figment.merge((path.join("."), value));
        set.push((path.join("."), var));
    }
    Ok((figment, set))
}

/// An environment value parsed as the type of the setting's default:
/// strings stay strings (`SEEKER_MODEL__ID=12345` is the id "12345").
fn env_value(default: &serde_json::Value, raw: &str) -> Result<figment::value::Value, String> {
    use figment::value::Value;
    match default {
        serde_json::Value::Null => Err("no such setting (see config/seeker.toml)".into()),
        serde_json::Value::String(_) => Ok(Value::from(raw.to_string())),
        serde_json::Value::Bool(_) => raw
            .parse::<bool>()
            .map(Value::from)
            .map_err(|_| format!("expected true or false, got {raw:?}")),
        // A setting whose default is fractional (`search.hybrid.rrf_k`) takes
        // any finite number; the others are counts.
        serde_json::Value::Number(n) if n.is_f64() => raw
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite())
            .map(Value::from)
            .ok_or_else(|| format!("expected a number, got {raw:?}")),
        serde_json::Value::Number(_) => raw.parse::<u64>().map(Value::from).map_err(|e| {
            if matches!(e.kind(), std::num::IntErrorKind::PosOverflow) {
                format!("{raw} is too large (at most {})", u64::MAX)
            } else {
                format!("expected a non-negative integer, got {raw:?}")
            }
        }),
        // Lists of strings: comma-separated.
        serde_json::Value::Array(_) => Ok(Value::from(
            raw.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>(),
        )),
        _ => Err("this setting cannot be set from the environment".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn env_overrides_and_unknown_keys() {
        let config = Config::load(
            None,
            env(&[
                ("SEEKER_SERVER__PORT", "9000"),
                ("SEEKER_MODEL__ID", "12345"),
                ("SEEKER_POLICY__DEFAULT", "true"),
                ("SEEKER_SEARCH__DENSE__BATCH_SIZE", "4"),
                ("SEEKER_BIN", "ignored"),
            ]),
        )
        .unwrap();
        assert_eq!(config.search.dense.batch_size, 4);
        assert_eq!(config.server.port, 9000);
        // String settings stay strings, whatever they look like.
        assert_eq!(config.model.id, "12345");
        assert_eq!(config.policy.default, "true");

        let err = Config::load(None, env(&[("SEEKER_SERVER__PORT", "notaport")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("SEEKER_SERVER__PORT") && err.contains("notaport"),
            "{err}"
        );
        // Too large for any setting, or for this one: the variable is named
        // and the message says why.
        let err = Config::load(
            None,
            env(&[("SEEKER_SERVER__MAX_BODY_BYTES", "99999999999999999999")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("SEEKER_SERVER__MAX_BODY_BYTES") && err.contains("too large"),
            "{err}"
        );
        let err = Config::load(None, env(&[("SEEKER_SERVER__PORT", "99999")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("environment variable SEEKER_SERVER__PORT")
                && err.contains("expected an integer from 0 to 65535"),
            "{err}"
        );
        let err = Config::load(None, env(&[("SEEKER_SERVER__PROT", "1")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("SEEKER_SERVER__PROT") && err.contains("no such setting"),
            "{err}"
        );
        let err = Config::load(None, env(&[("SEEKER_SERVER__PORT", "70000")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("server.port"), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, "[server]\nprot = 1\n").unwrap();
        let err = Config::load(Some(&file), []).unwrap_err().to_string();
        assert!(err.contains("prot") && err.contains("bad.toml"), "{err}");
        assert!(!err.contains("figment"), "{err}");
        let err = Config::load(Some(dir.path()), []).unwrap_err().to_string();
        assert!(err.contains("not a file"), "{err}");
        let err = Config::load(Some(&dir.path().join("missing.toml")), [])
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing.toml"), "{err}");
    }

    /// A fractional setting takes a decimal from the environment; a count
    /// still refuses one, and a non-number is named as such.
    #[test]
    fn fractional_settings_take_decimals_from_the_environment() {
        let config = Config::load(
            None,
            env(&[
                ("SEEKER_SEARCH__HYBRID__RRF_K", "0.5"),
                ("SEEKER_SEARCH__HYBRID__BM25_WEIGHT", "2"),
            ]),
        )
        .unwrap();
        assert_eq!(config.search.hybrid.rrf_k, 0.5);
        assert_eq!(config.search.hybrid.bm25_weight, 2.0);
        for (var, raw, expected) in [
            ("SEEKER_SEARCH__HYBRID__RRF_K", "many", "expected a number"),
            ("SEEKER_SEARCH__HYBRID__RRF_K", "inf", "expected a number"),
            (
                "SEEKER_SERVER__PORT",
                "80.5",
                "expected a non-negative integer",
            ),
        ] {
            let err = Config::load(None, env(&[(var, raw)]))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(var) && err.contains(expected),
                "{var}={raw}: {err}"
            );
        }
    }
}
