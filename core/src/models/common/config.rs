//! The `key:value,…` config parser the models share, and its values.

use super::rounding::round_down;

/// A bad `--config` string for a model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Parses `key:value,key:value` (PyTorch's syntax) for `model`, accepting only `known`
/// keys; a key given twice keeps its last value, as PyTorch does.
pub fn parse_config<'a>(
    model: &str,
    conf: &'a str,
    known: &[&str],
) -> Result<Vec<(&'a str, &'a str)>, ConfigError> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for part in conf.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = part.split_once(':') else {
            return Err(ConfigError(format!(
                "{model}: expected key:value in config, got '{part}'"
            )));
        };
        let (k, v) = (k.trim(), v.trim());
        if !known.contains(&k) {
            let list = if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            };
            return Err(ConfigError(format!(
                "{model}: unknown config key '{k}' (known: {list})"
            )));
        }
        if v.is_empty() {
            return Err(ConfigError(format!(
                "{model}: config key '{k}' has no value"
            )));
        }
        out.retain(|(key, _)| *key != k);
        out.push((k, v));
    }
    Ok(out)
}

/// A `True`/`False` config value (also `true`/`false`, `1`/`0`).
pub fn parse_bool(model: &str, key: &str, v: &str) -> Result<bool, ConfigError> {
    match v {
        "True" | "true" | "1" => Ok(true),
        "False" | "false" | "0" => Ok(false),
        _ => Err(ConfigError(format!(
            "{model}: {key} expects True or False, got '{v}'"
        ))),
    }
}

/// A non-negative integer config value within `[min, max]`.
pub fn parse_u64(model: &str, key: &str, v: &str, min: u64, max: u64) -> Result<u64, ConfigError> {
    let n: u64 = v.parse().map_err(|_| {
        ConfigError(format!(
            "{model}: {key} expects a non-negative integer, got '{v}'"
        ))
    })?;
    if n < min || n > max {
        return Err(ConfigError(format!(
            "{model}: {key} must be between {min} and {max}, got {n}"
        )));
    }
    Ok(n)
}

/// A number config value in `(lo, hi]` (`lo` excluded unless `lo_inclusive`).
pub fn parse_f64(
    model: &str,
    key: &str,
    v: &str,
    lo: f64,
    hi: f64,
    lo_inclusive: bool,
) -> Result<f64, ConfigError> {
    let x: f64 = v
        .parse()
        .map_err(|_| ConfigError(format!("{model}: {key} expects a number, got '{v}'")))?;
    let above = if lo_inclusive { x >= lo } else { x > lo };
    if !(above && x <= hi && x.is_finite()) {
        let open = if lo_inclusive { '[' } else { '(' };
        return Err(ConfigError(format!(
            "{model}: {key} must be in {open}{lo}, {hi}], got {v}"
        )));
    }
    Ok(x)
}

/// A size in MiB given as a config value (decimals allowed), as bytes rounded down to
/// 256 bytes (CUDA's allocation alignment).
pub fn parse_mib(model: &str, key: &str, v: &str) -> Result<u64, ConfigError> {
    let x = parse_f64(model, key, v, 0.0, 1e9, true)?;
    Ok(round_down((x * f64::from(1u32 << 20)) as u64, 256))
}

/// Formats bytes as a MiB config value (`2`, `1.5`).
#[must_use]
pub fn fmt_mib(bytes: u64) -> String {
    format!("{}", bytes as f64 / f64::from(1u32 << 20))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_strings_parse_with_clear_errors() {
        let kv = parse_config(
            "bfc",
            "allow_growth:False, memory_fraction:0.5",
            &["allow_growth", "memory_fraction"],
        )
        .unwrap();
        assert_eq!(
            kv,
            vec![("allow_growth", "False"), ("memory_fraction", "0.5")]
        );
        assert!(
            parse_config("bfc", "bogus:1", &["allow_growth"])
                .unwrap_err()
                .0
                .contains("unknown config key 'bogus'")
        );
        assert!(parse_config("bfc", "allow_growth", &["allow_growth"]).is_err());
        assert!(parse_bool("bfc", "allow_growth", "yes").is_err());
        assert_eq!(parse_mib("x", "k", "1.5").unwrap(), 3 << 19);
        assert!(parse_f64("x", "k", "0", 0.0, 1.0, false).is_err());
        assert!(parse_u64("x", "k", "40", 1, 32).is_err());
    }
}
