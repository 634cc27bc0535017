//! PyTorch's allocator options (`PYTORCH_CUDA_ALLOC_CONF`), parsed as PyTorch 2.11 parses
//! them (pytorch-allocator.md §2), and read from a snapshot's `allocator_settings`.

use crate::models::ConfigError;
use crate::snapshot::RawSettings;

const MIB: u64 = 1 << 20;

/// The placement-relevant options of the native caching allocator.
#[derive(Debug, Clone, PartialEq)]
pub struct PyTorchConfig {
    /// `max_split_size_mb` in bytes; `u64::MAX` = unlimited (the default).
    pub max_split_size_bytes: u64,
    /// `max_non_split_rounding_mb` in bytes (default: the large segment size).
    pub max_non_split_rounding_bytes: u64,
    /// `large_segment_size_mb` in bytes (2.11; default 20 MiB).
    pub large_segment_size_bytes: u64,
    /// `roundup_power2_divisions`: entry i covers sizes in [2^(20+i), 2^(21+i)) (entry 0 also
    /// everything below 2 MiB); 0 or 1 = plain 512-byte rounding.
    pub roundup_power2_divisions: [u32; 16],
    /// `garbage_collection_threshold` (0 = off; only active under a memory cap).
    pub garbage_collection_threshold: f64,
    pub expandable_segments: bool,
    /// `per_process_memory_fraction` (1.0 = no limit from the config).
    pub per_process_memory_fraction: f64,
    /// Total device memory as `totalGlobalMem` (sizes the expandable-segment reservation).
    pub device_total_bytes: u64,
    /// `throw_on_cudamalloc_oom` (2.12+, #179473): a new segment that would take the
    /// reserved bytes past `per_process_memory_fraction × totalGlobalMem` is rejected before
    /// any cudaMalloc, and the malloc fails at once, without the release-and-retry ladder
    /// and without an `oom` trace entry (pytorch-allocator.md §5.5 step 3).
    pub throw_on_cudamalloc_oom: bool,
    /// Keys of a snapshot's `PYTORCH_CUDA_ALLOC_CONF` this parser does not know (a newer
    /// PyTorch's): skipped and kept here to be reported, since PyTorch accepted them when
    /// it recorded ([`PyTorchConfig::from_settings`]). Always empty for a user's `--config`,
    /// where an unknown key is an error.
    pub unknown_keys: Vec<String>,
    /// Keys the user set explicitly, in canonical order, for [`PyTorchConfig::canonical`].
    explicit: Vec<&'static str>,
}

/// H200's `total_memory` as PyTorch 2.11 reports it (the shared traces' recording GPU).
pub const H200_TOTAL_BYTES: u64 = 150_109_880_320;

impl Default for PyTorchConfig {
    fn default() -> Self {
        PyTorchConfig {
            max_split_size_bytes: u64::MAX,
            max_non_split_rounding_bytes: 20 * MIB,
            large_segment_size_bytes: 20 * MIB,
            roundup_power2_divisions: [0; 16],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            per_process_memory_fraction: 1.0,
            device_total_bytes: H200_TOTAL_BYTES,
            throw_on_cudamalloc_oom: false,
            unknown_keys: Vec::new(),
            explicit: Vec::new(),
        }
    }
}

/// A config string PyTorch would reject, with PyTorch-like wording.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", crate::models::common::config::elide_to(.0, 400))]
pub struct PyTorchConfigError(pub String);

impl From<PyTorchConfigError> for ConfigError {
    fn from(e: PyTorchConfigError) -> ConfigError {
        ConfigError::PyTorch(e.0)
    }
}

fn tokens(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    for c in s.chars() {
        match c {
            ',' | ':' | '[' | ']' => {
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
                out.push(c.to_string());
            }
            c if c.is_whitespace() => {}
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

fn parse_bool(key: &str, v: &str) -> Result<bool, PyTorchConfigError> {
    match v {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err(PyTorchConfigError(format!(
            "Expected a single True/False argument for {key}"
        ))),
    }
}

fn parse_u64(key: &str, v: &str) -> Result<u64, PyTorchConfigError> {
    v.parse::<u64>().map_err(|_| {
        PyTorchConfigError(format!(
            "Expected a non-negative integer value for {key}, got '{v}'"
        ))
    })
}

fn log2_floor(v: u64) -> u32 {
    v.ilog2()
}

impl PyTorchConfig {
    /// Whether `other` is this configuration but for `max_split_size_mb`,
    /// `roundup_power2_divisions`, `garbage_collection_threshold` and
    /// `expandable_segments` (and for which keys were written out): the settings whose first effect on a replay `core::prefix`
    /// knows.
    #[must_use]
    pub fn same_but_swept(&self, other: &PyTorchConfig) -> bool {
        let plain = |c: &PyTorchConfig| PyTorchConfig {
            max_split_size_bytes: 0,
            roundup_power2_divisions: [0; 16],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            explicit: Vec::new(),
            ..c.clone()
        };
        plain(self) == plain(other)
    }

    /// Parses a `PYTORCH_CUDA_ALLOC_CONF` string on top of PyTorch's defaults.
    pub fn parse(conf: &str) -> Result<PyTorchConfig, PyTorchConfigError> {
        let mut c = PyTorchConfig::default();
        c.apply(conf)?;
        Ok(c)
    }

    /// Applies a config string the way `parseArgs` does: `max_split_size`,
    /// `roundup_power2_divisions`, `garbage_collection_threshold` and
    /// `max_non_split_rounding` are reset first, other options keep their values.
    pub fn apply(&mut self, conf: &str) -> Result<(), PyTorchConfigError> {
        self.apply_keys(conf, false)
    }

    /// [`PyTorchConfig::apply`]; with `keep_unknown`, an unknown key is skipped and listed
    /// in [`PyTorchConfig::unknown_keys`] instead of refused.
    fn apply_keys(&mut self, conf: &str, keep_unknown: bool) -> Result<(), PyTorchConfigError> {
        let toks = tokens(conf);
        // large_segment_size_mb is parsed before the other keys (2.11).
        let mut i = 0;
        let mut pairs: Vec<(String, Vec<String>)> = Vec::new();
        while i < toks.len() {
            let key = toks[i].clone();
            if key == "," {
                i += 1;
                continue;
            }
            if matches!(key.as_str(), ":" | "[" | "]") {
                return Err(PyTorchConfigError(format!(
                    "Expected a key in allocator config, got '{key}'"
                )));
            }
            if toks.get(i + 1).map(String::as_str) != Some(":") {
                return Err(PyTorchConfigError(format!(
                    "Error parsing allocator config: expected ':' after '{key}'"
                )));
            }
            i += 2;
            let mut value = Vec::new();
            if toks.get(i).map(String::as_str) == Some("[") {
                let mut depth = 0;
                while i < toks.len() {
                    let t = &toks[i];
                    if t == "[" {
                        depth += 1;
                    } else if t == "]" {
                        depth -= 1;
                    }
                    value.push(t.clone());
                    i += 1;
                    if depth == 0 {
                        break;
                    }
                }
                if depth != 0 {
                    return Err(PyTorchConfigError(format!(
                        "Expected closing ']' in the value of {key}"
                    )));
                }
            } else if let Some(t) = toks.get(i) {
                if matches!(t.as_str(), "," | ":" | "]") {
                    return Err(PyTorchConfigError(format!("Expected a value for {key}")));
                }
                value.push(t.clone());
                i += 1;
            } else {
                return Err(PyTorchConfigError(format!("Expected a value for {key}")));
            }
            pairs.push((key, value));
        }
        self.max_split_size_bytes = u64::MAX;
        self.roundup_power2_divisions = [0; 16];
        self.garbage_collection_threshold = 0.0;
        self.explicit.retain(|k| {
            !matches!(
                *k,
                "max_split_size_mb"
                    | "roundup_power2_divisions"
                    | "garbage_collection_threshold"
                    | "max_non_split_rounding_mb"
            )
        });
        for (k, v) in &pairs {
            if k == "large_segment_size_mb" {
                let mb = parse_u64(k, &v[0])?;
                if mb <= 10 {
                    return Err(PyTorchConfigError(format!(
                        "large_segment_size_mb must be > 10, got {mb}"
                    )));
                }
                self.large_segment_size_bytes = mb * MIB;
                self.mark("large_segment_size_mb");
            }
        }
        self.max_non_split_rounding_bytes = self.large_segment_size_bytes;
        let large_mb = self.large_segment_size_bytes / MIB;
        for (k, v) in &pairs {
            let single = || -> Result<&str, PyTorchConfigError> {
                if v.len() == 1 {
                    Ok(v[0].as_str())
                } else {
                    Err(PyTorchConfigError(format!(
                        "Expected a single value for {k}"
                    )))
                }
            };
            match k.as_str() {
                "large_segment_size_mb" => {}
                "max_split_size_mb" => {
                    let mb = parse_u64(k, single()?)?;
                    if mb < large_mb {
                        return Err(PyTorchConfigError(format!(
                            "CachingAllocator option max_split_size_mb too small, must be >= {large_mb}"
                        )));
                    }
                    self.max_split_size_bytes = mb.saturating_mul(MIB);
                    self.mark("max_split_size_mb");
                }
                "max_non_split_rounding_mb" => {
                    let mb = parse_u64(k, single()?)?;
                    if mb < large_mb {
                        return Err(PyTorchConfigError(format!(
                            "CachingAllocator option max_non_split_rounding_mb too small, must be >= {large_mb}"
                        )));
                    }
                    self.max_non_split_rounding_bytes = mb.saturating_mul(MIB);
                    self.mark("max_non_split_rounding_mb");
                }
                "garbage_collection_threshold" => {
                    let t: f64 = single()?.parse().map_err(|_| {
                        PyTorchConfigError(format!("Expected a float value for {k}"))
                    })?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(PyTorchConfigError(
                            "garbage_collect_threshold is invalid, set it in (0.0, 1.0)".into(),
                        ));
                    }
                    self.garbage_collection_threshold = t;
                    self.mark("garbage_collection_threshold");
                }
                "expandable_segments" => {
                    self.expandable_segments = parse_bool(k, single()?)?;
                    self.mark("expandable_segments");
                }
                "roundup_power2_divisions" => {
                    self.parse_divisions(v)?;
                    self.mark("roundup_power2_divisions");
                }
                "per_process_memory_fraction" => {
                    let f: f64 = single()?.parse().map_err(|_| {
                        PyTorchConfigError(format!("Expected a float value for {k}"))
                    })?;
                    if !(0.0..=1.0).contains(&f) {
                        return Err(PyTorchConfigError(format!(
                            "per_process_memory_fraction is invalid, set it in [0.0, 1.0], got {f}"
                        )));
                    }
                    self.per_process_memory_fraction = f;
                    self.mark("per_process_memory_fraction");
                }
                "throw_on_cudamalloc_oom" => {
                    self.throw_on_cudamalloc_oom = parse_bool(k, single()?)?;
                    self.mark("throw_on_cudamalloc_oom");
                }
                // Options of the pinned host allocator and of the allocator's locking:
                // accepted and checked, no device decision depends on them.
                "release_lock_on_cudamalloc"
                | "release_lock_on_hipmalloc"
                | "pinned_use_cuda_host_register"
                | "pinned_use_hip_host_register"
                | "pinned_use_background_threads"
                | "pinned_free_catch_all"
                | "graph_capture_record_stream_reuse" => {
                    parse_bool(k, single()?)?;
                }
                "pinned_reserve_segment_size_mb" => {
                    if parse_u64(k, single()?)? == 0 {
                        return Err(PyTorchConfigError(
                            "Pinned reserve segment size has to be greater than 0".into(),
                        ));
                    }
                }
                "pinned_num_register_threads"
                | "pinned_max_round_threshold_mb"
                | "pinned_max_cached_size_mb" => {
                    parse_u64(k, single()?)?;
                }
                // `expandable_segments_reserve` (2.13+, #192269): the virtual address range
                // each expandable segment reserves (a fraction of the device or `NG`).
                // PyTorch ignores a malformed value with a warning, so any value is
                // accepted; not modelled (the model reserves 9/8 of the device, the default).
                "expandable_segments_handle_type" | "expandable_segments_reserve" => {
                    single()?;
                }
                "expandable_segments_reserve_by_class" => {
                    if v.first().map(String::as_str) != Some("[") {
                        return Err(PyTorchConfigError(format!(
                            "Expected '[' after {k}: (a list of class:reserve pairs)"
                        )));
                    }
                }
                "backend" => {
                    let b = single()?;
                    if b != "native" {
                        return Err(PyTorchConfigError(format!(
                            "backend:{b} has no caching allocator to simulate (only backend:native)"
                        )));
                    }
                }
                _ if keep_unknown => {
                    if !self.unknown_keys.contains(k) {
                        self.unknown_keys.push(k.clone());
                    }
                }
                _ => {
                    return Err(PyTorchConfigError(format!(
                        "Unrecognized key '{k}' in Accelerator allocator config."
                    )));
                }
            }
        }
        Ok(())
    }

    fn mark(&mut self, key: &'static str) {
        if !self.explicit.contains(&key) {
            self.explicit.push(key);
        }
    }

    fn parse_divisions(&mut self, v: &[String]) -> Result<(), PyTorchConfigError> {
        let check_pow2 = |n: u64| -> Result<u32, PyTorchConfigError> {
            if n != 0 && !n.is_power_of_two() {
                return Err(PyTorchConfigError(format!(
                    "For roundups, the divisions has to be power of 2 or 0 to disable roundup, got {n}"
                )));
            }
            Ok(n as u32)
        };
        if v.len() == 1 {
            let n = check_pow2(parse_u64("roundup_power2_divisions", &v[0])?)?;
            self.roundup_power2_divisions = [n; 16];
            return Ok(());
        }
        // [k:v,k:v,>:v]
        let inner = &v[1..v.len() - 1];
        let mut first = true;
        let mut last_index: usize = 0;
        let mut i = 0;
        while i < inner.len() {
            if inner[i] == "," {
                i += 1;
                continue;
            }
            let key = &inner[i];
            if inner.get(i + 1).map(String::as_str) != Some(":") || i + 2 >= inner.len() {
                return Err(PyTorchConfigError(
                    "Expected key:value pairs in roundup_power2_divisions".into(),
                ));
            }
            let val = check_pow2(parse_u64("roundup_power2_divisions", &inner[i + 2])?)?;
            i += 3;
            if key == ">" {
                for e in &mut self.roundup_power2_divisions[(last_index + 1).min(16)..] {
                    *e = val;
                }
            } else {
                let k = parse_u64("roundup_power2_divisions", key)?;
                if k == 0 || !k.is_power_of_two() {
                    return Err(PyTorchConfigError(format!(
                        "For roundups, the intervals have to be power of 2, got {k}"
                    )));
                }
                let index = (log2_floor(k) as usize).min(15);
                if first {
                    for e in &mut self.roundup_power2_divisions[..index] {
                        *e = val;
                    }
                    first = false;
                }
                self.roundup_power2_divisions[index] = val;
                last_index = index;
            }
        }
        Ok(())
    }

    /// The configuration a snapshot was recorded with: its `PYTORCH_CUDA_ALLOC_CONF`,
    /// with the effective `max_split_size` and divisions table taken from the settings.
    /// A key the recording PyTorch knew and this parser does not is skipped and listed in
    /// [`PyTorchConfig::unknown_keys`], never a refusal.
    pub fn from_settings(s: &RawSettings) -> Result<PyTorchConfig, PyTorchConfigError> {
        let mut c = PyTorchConfig::default();
        c.apply_keys(&s.conf, true)?;
        if s.present {
            c.max_split_size_bytes = s.max_split_size_bytes.unwrap_or(u64::MAX);
            if let Some(t) = s.roundup_power2_divisions {
                c.roundup_power2_divisions = t;
            }
            c.garbage_collection_threshold = s.garbage_collection_threshold;
            c.expandable_segments = s.expandable_segments;
        }
        Ok(c)
    }

    /// The effective configuration as a canonical `key:value,…` string (keys that differ
    /// from PyTorch's defaults, in a fixed order).
    #[must_use]
    pub fn canonical(&self) -> String {
        let d = PyTorchConfig::default();
        let mut parts = Vec::new();
        if self.large_segment_size_bytes != d.large_segment_size_bytes {
            parts.push(format!(
                "large_segment_size_mb:{}",
                self.large_segment_size_bytes / MIB
            ));
        }
        if self.expandable_segments {
            parts.push("expandable_segments:True".to_string());
        }
        if self.max_split_size_bytes != u64::MAX {
            parts.push(format!(
                "max_split_size_mb:{}",
                self.max_split_size_bytes / MIB
            ));
        }
        if self.max_non_split_rounding_bytes != self.large_segment_size_bytes {
            parts.push(format!(
                "max_non_split_rounding_mb:{}",
                self.max_non_split_rounding_bytes / MIB
            ));
        }
        let t = &self.roundup_power2_divisions;
        if t.iter().any(|&x| x != 0) {
            if t.iter().all(|&x| x == t[0]) {
                parts.push(format!("roundup_power2_divisions:{}", t[0]));
            } else {
                let items: Vec<String> = t
                    .iter()
                    .enumerate()
                    .map(|(i, v)| format!("{}:{v}", 1u64 << i))
                    .collect();
                parts.push(format!("roundup_power2_divisions:[{}]", items.join(",")));
            }
        }
        if self.garbage_collection_threshold > 0.0 {
            parts.push(format!(
                "garbage_collection_threshold:{}",
                self.garbage_collection_threshold
            ));
        }
        if self.per_process_memory_fraction < 1.0 {
            parts.push(format!(
                "per_process_memory_fraction:{}",
                self.per_process_memory_fraction
            ));
        }
        if self.throw_on_cudamalloc_oom {
            parts.push("throw_on_cudamalloc_oom:True".to_string());
        }
        parts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_simple_keys() {
        let c = PyTorchConfig::parse("").unwrap();
        assert_eq!(c.max_split_size_bytes, u64::MAX);
        let c = PyTorchConfig::parse("max_split_size_mb:64, expandable_segments:True").unwrap();
        assert_eq!(c.max_split_size_bytes, 64 << 20);
        assert!(c.expandable_segments);
        assert_eq!(
            c.canonical(),
            "expandable_segments:True,max_split_size_mb:64"
        );
    }

    #[test]
    fn bad_strings_are_rejected_like_pytorch() {
        assert!(PyTorchConfig::parse("expandable_segments:true").is_err());
        assert!(PyTorchConfig::parse("max_split_size_mb:10").is_err());
        assert!(PyTorchConfig::parse("max_split_size_mb:20").is_ok());
        assert!(
            PyTorchConfig::parse("bogus:1")
                .unwrap_err()
                .0
                .contains("Unrecognized key")
        );
        assert!(PyTorchConfig::parse("garbage_collection_threshold:1.5").is_err());
        assert!(PyTorchConfig::parse("roundup_power2_divisions:3").is_err());
        assert!(PyTorchConfig::parse("max_split_size_mb").is_err());
    }

    #[test]
    fn division_lists_use_the_fixed_parser() {
        let c = PyTorchConfig::parse("roundup_power2_divisions:[256:1,512:2,>:4]").unwrap();
        let mut want = [1u32; 16];
        want[9] = 2;
        for w in &mut want[10..] {
            *w = 4;
        }
        assert_eq!(c.roundup_power2_divisions, want);
    }

    #[test]
    fn keys_new_since_2_11_are_accepted() {
        let c = PyTorchConfig::parse(
            "throw_on_cudamalloc_oom:True,expandable_segments_reserve:0.5,\
             expandable_segments_reserve_by_class:[capture:0.25,workspace:40G],\
             pinned_reserve_segment_size_mb:64,pinned_free_catch_all:True",
        )
        .unwrap();
        assert!(c.throw_on_cudamalloc_oom);
        assert_eq!(c.canonical(), "throw_on_cudamalloc_oom:True");
        assert!(c.unknown_keys.is_empty());
        assert!(PyTorchConfig::parse("throw_on_cudamalloc_oom:yes").is_err());
        assert!(PyTorchConfig::parse("pinned_reserve_segment_size_mb:0").is_err());
        assert!(PyTorchConfig::parse("expandable_segments_reserve_by_class:0.5").is_err());
    }

    #[test]
    fn unknown_keys_are_kept_from_a_snapshot_and_refused_from_a_user() {
        let conf = "expandable_segments:True,some_2_14_key:[a:1,b:2],another_key:7";
        let e = PyTorchConfig::parse(conf).unwrap_err();
        assert!(e.0.contains("Unrecognized key 'some_2_14_key'"), "{e}");
        let settings = RawSettings {
            conf: conf.into(),
            expandable_segments: true,
            present: true,
            ..RawSettings::default()
        };
        let c = PyTorchConfig::from_settings(&settings).unwrap();
        assert!(c.expandable_segments);
        assert_eq!(c.unknown_keys, ["some_2_14_key", "another_key"]);
        // A known key with a bad value is still an error, even in a snapshot.
        let bad = RawSettings {
            conf: "max_split_size_mb:1".into(),
            ..settings
        };
        assert!(PyTorchConfig::from_settings(&bad).is_err());
    }

    #[test]
    fn large_segment_size_sets_the_tolerance() {
        let c = PyTorchConfig::parse("large_segment_size_mb:40").unwrap();
        assert_eq!(c.large_segment_size_bytes, 40 << 20);
        assert_eq!(c.max_non_split_rounding_bytes, 40 << 20);
        assert!(PyTorchConfig::parse("large_segment_size_mb:40,max_split_size_mb:30").is_err());
    }
}
