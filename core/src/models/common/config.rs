//! The `key:value,…` config parser the models share, its values, and the one error type
//! every model's config (PyTorch's included) is refused with.

use super::rounding::round_down;
use crate::models::AllocatorKind;

/// A model and config that cannot be built: an unknown model, a key the model does not
/// know, a value it cannot take, or a `PYTORCH_CUDA_ALLOC_CONF` PyTorch would reject.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("unknown allocator '{}' (known: {})", elide(name), AllocatorKind::names().join(", "))]
    UnknownAllocator { name: String },
    #[error("{model}: expected key:value in config, got '{}'", elide(part))]
    NotKeyValue { model: AllocatorKind, part: String },
    #[error(
        "{model}: unknown config key '{}' (known: {})",
        elide(key),
        known_list(known)
    )]
    UnknownKey {
        model: AllocatorKind,
        key: String,
        known: Vec<&'static str>,
    },
    #[error("{model}: config key '{}' has no value", elide(key))]
    NoValue { model: AllocatorKind, key: String },
    /// A value of the wrong type (`expected`: `True or False`, `a number`, …).
    #[error("{model}: {} expects {expected}, got '{}'", elide(key), elide(value))]
    WrongType {
        model: AllocatorKind,
        key: String,
        expected: &'static str,
        value: String,
    },
    /// A value outside what the model accepts (`range`: `between 1 and 6`, `in (0, 1]`, `a
    /// power of two`).
    #[error("{model}: {} must be {range}, got {}", elide(key), elide(value))]
    OutOfRange {
        model: AllocatorKind,
        key: String,
        range: String,
        value: String,
    },
    /// Values each valid alone that the model refuses together, in the model's words.
    #[error("{model}: {reason}")]
    Inconsistent {
        model: AllocatorKind,
        reason: &'static str,
    },
    /// Two values of the same config where one must not exceed the other.
    #[error("{model}: {low_key} {low} exceeds {high_key} {high}")]
    Exceeds {
        model: AllocatorKind,
        low_key: &'static str,
        low: u64,
        high_key: &'static str,
        high: u64,
    },
    /// PyTorch's parser refused it, in PyTorch's words (`PyTorchConfigError`'s).
    #[error("{}", elide_to(.0, 400))]
    PyTorch(String),
}

/// Longest text a config error echoes whole: a longer config value is elided in the
/// middle, so a 100 KB `--config` makes a one-line error, not a 100 KB one.
pub const ECHO_MAX_CHARS: usize = 120;

/// `s` as an error echoes it: whole up to [`ECHO_MAX_CHARS`] characters, else its first
/// 80 and last 30 characters around the number of bytes left out.
#[must_use]
pub fn elide(s: &str) -> std::borrow::Cow<'_, str> {
    elide_to(s, ECHO_MAX_CHARS)
}

/// `s` whole up to `max` characters (≥ 120), else elided in the middle.
#[must_use]
pub fn elide_to(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    let n = s.chars().count();
    if n <= max.max(ECHO_MAX_CHARS) {
        return s.into();
    }
    let head: String = s.chars().take(80).collect();
    let tail: String = s.chars().skip(n - 30).collect();
    let left_out = s.len() - head.len() - tail.len();
    format!("{head}…[{left_out} bytes]…{tail}").into()
}

fn known_list(known: &[&str]) -> String {
    if known.is_empty() {
        "none".to_string()
    } else {
        known.join(", ")
    }
}

/// Parses `key:value,key:value` (PyTorch's syntax) for `model`, accepting only `known`
/// keys; a key given twice keeps its last value, as PyTorch does.
pub fn parse_config<'a>(
    model: AllocatorKind,
    conf: &'a str,
    known: &[&'static str],
) -> Result<Vec<(&'a str, &'a str)>, ConfigError> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for part in conf.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = part.split_once(':') else {
            return Err(ConfigError::NotKeyValue {
                model,
                part: part.to_string(),
            });
        };
        let (k, v) = (k.trim(), v.trim());
        if !known.contains(&k) {
            return Err(ConfigError::UnknownKey {
                model,
                key: k.to_string(),
                known: known.to_vec(),
            });
        }
        if v.is_empty() {
            return Err(ConfigError::NoValue {
                model,
                key: k.to_string(),
            });
        }
        out.retain(|(key, _)| *key != k);
        out.push((k, v));
    }
    Ok(out)
}

fn wrong_type(model: AllocatorKind, key: &str, expected: &'static str, v: &str) -> ConfigError {
    ConfigError::WrongType {
        model,
        key: key.to_string(),
        expected,
        value: v.to_string(),
    }
}

/// [`ConfigError::OutOfRange`].
#[must_use]
pub fn out_of_range(
    model: AllocatorKind,
    key: &str,
    range: impl Into<String>,
    value: &dyn std::fmt::Display,
) -> ConfigError {
    ConfigError::OutOfRange {
        model,
        key: key.to_string(),
        range: range.into(),
        value: value.to_string(),
    }
}

/// A power-of-two integer config value within `[min, max]`.
pub fn parse_pow2(
    model: AllocatorKind,
    key: &str,
    v: &str,
    min: u64,
    max: u64,
) -> Result<u64, ConfigError> {
    let n = parse_u64(model, key, v, min, max)?;
    if !n.is_power_of_two() {
        return Err(out_of_range(model, key, "a power of two", &v));
    }
    Ok(n)
}

/// `key:value` where `value` differs from the default, for [`join_options`].
#[must_use]
pub fn changed<T: PartialEq + Copy + std::fmt::Display>(
    key: &str,
    value: T,
    default: T,
) -> Option<String> {
    (value != default).then(|| format!("{key}:{value}"))
}

/// A model's canonical config string: the options set (`key:value`), in order, joined by
/// commas; empty when all are the defaults.
#[must_use]
pub fn join_options<const N: usize>(options: [Option<String>; N]) -> String {
    options.into_iter().flatten().collect::<Vec<_>>().join(",")
}

/// A `True`/`False` config value (also `true`/`false`, `1`/`0`).
pub fn parse_bool(model: AllocatorKind, key: &str, v: &str) -> Result<bool, ConfigError> {
    match v {
        "True" | "true" | "1" => Ok(true),
        "False" | "false" | "0" => Ok(false),
        _ => Err(wrong_type(model, key, "True or False", v)),
    }
}

/// A non-negative integer config value within `[min, max]`.
pub fn parse_u64(
    model: AllocatorKind,
    key: &str,
    v: &str,
    min: u64,
    max: u64,
) -> Result<u64, ConfigError> {
    let n: u64 = v
        .parse()
        .map_err(|_| wrong_type(model, key, "a non-negative integer", v))?;
    if n < min || n > max {
        return Err(out_of_range(
            model,
            key,
            format!("between {min} and {max}"),
            &n,
        ));
    }
    Ok(n)
}

/// A number config value in `(lo, hi]` (`lo` excluded unless `lo_inclusive`).
pub fn parse_f64(
    model: AllocatorKind,
    key: &str,
    v: &str,
    lo: f64,
    hi: f64,
    lo_inclusive: bool,
) -> Result<f64, ConfigError> {
    let x: f64 = v
        .parse()
        .map_err(|_| wrong_type(model, key, "a number", v))?;
    let above = if lo_inclusive { x >= lo } else { x > lo };
    if !(above && x <= hi && x.is_finite()) {
        let open = if lo_inclusive { '[' } else { '(' };
        return Err(out_of_range(
            model,
            key,
            format!("in {open}{lo}, {hi}]"),
            &v,
        ));
    }
    Ok(x)
}

/// A size in MiB given as a config value (decimals allowed), as bytes rounded down to
/// 256 bytes (CUDA's allocation alignment).
pub fn parse_mib(model: AllocatorKind, key: &str, v: &str) -> Result<u64, ConfigError> {
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
        let bfc = AllocatorKind::Bfc;
        let kv = parse_config(
            bfc,
            "allow_growth:False, memory_fraction:0.5",
            &["allow_growth", "memory_fraction"],
        )
        .unwrap();
        assert_eq!(
            kv,
            vec![("allow_growth", "False"), ("memory_fraction", "0.5")]
        );
        let e = parse_config(bfc, "bogus:1", &["allow_growth"]).unwrap_err();
        assert!(matches!(&e, ConfigError::UnknownKey { key, .. } if key == "bogus"));
        assert_eq!(
            e.to_string(),
            "bfc: unknown config key 'bogus' (known: allow_growth)"
        );
        assert!(parse_config(bfc, "allow_growth", &["allow_growth"]).is_err());
        assert!(parse_bool(bfc, "allow_growth", "yes").is_err());
        assert_eq!(parse_mib(bfc, "k", "1.5").unwrap(), 3 << 19);
        assert_eq!(
            parse_f64(bfc, "k", "0", 0.0, 1.0, false)
                .unwrap_err()
                .to_string(),
            "bfc: k must be in (0, 1], got 0"
        );
        assert_eq!(
            parse_u64(bfc, "k", "40", 1, 32).unwrap_err().to_string(),
            "bfc: k must be between 1 and 32, got 40"
        );
        assert_eq!(
            parse_u64(bfc, "k", "x", 1, 32).unwrap_err().to_string(),
            "bfc: k expects a non-negative integer, got 'x'"
        );
    }
}
