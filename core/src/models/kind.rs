//! Building any model at run time from its name and a config string.

use super::Allocator;
use super::bfc::{BfcConfig, BfcModel};
use super::buddy::{BuddyConfig, BuddyModel};
use super::cuda_malloc::CudaMallocModel;
use super::pytorch::{PyTorchConfig, PyTorchModel};
use super::rmm_arena::RmmArenaModel;
use super::rmm_binning::{RmmBinningConfig, RmmBinningModel};
use super::rmm_pool::{RmmPoolConfig, RmmPoolModel};
use super::tlsf::{TlsfConfig, TlsfModel};
use super::vmm_stitch::VmmStitchModel;
use crate::snapshot::RawSettings;

/// The models the CLI and the app know, by the names the CLI uses.
pub const MODEL_NAMES: &[&str] = &[
    "pytorch",
    "cuda-malloc",
    "bfc",
    "rmm-pool",
    "rmm-arena",
    "rmm-binning",
    "buddy",
    "tlsf",
    "vmm-stitch",
];

/// What `compare` runs without `--allocators`: every model with its defaults, plus
/// `pytorch@expandable_segments:True` (DESIGN.md).
pub const DEFAULT_COMPARE: &[&str] = &[
    "pytorch",
    "pytorch@expandable_segments:True",
    "cuda-malloc",
    "bfc",
    "rmm-pool",
    "rmm-arena",
    "rmm-binning",
    "buddy",
    "tlsf",
    "vmm-stitch",
];

/// A model and its configuration (`NAME` or `NAME@CONFIG` in `compare` lists).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    pub name: String,
    /// `None`: the model's defaults (for `pytorch`: the snapshot's own settings).
    pub config: Option<String>,
}

impl ModelSpec {
    /// Parses `NAME` or `NAME@CONFIG`.
    pub fn parse(s: &str) -> Result<ModelSpec, String> {
        let (name, config) = match s.split_once('@') {
            Some((n, c)) => (n.trim(), Some(c.trim().to_string())),
            None => (s.trim(), None),
        };
        if !MODEL_NAMES.contains(&name) {
            return Err(format!(
                "unknown allocator '{name}' (known: {})",
                MODEL_NAMES.join(", ")
            ));
        }
        Ok(ModelSpec {
            name: name.to_string(),
            config,
        })
    }

    /// `NAME` or `NAME@CONFIG`, as parsed.
    #[must_use]
    pub fn label(&self) -> String {
        match &self.config {
            Some(c) => format!("{}@{c}", self.name),
            None => self.name.clone(),
        }
    }
}

/// The PyTorch configuration a spec means for a snapshot with `settings`.
pub fn pytorch_config(spec: &ModelSpec, settings: &RawSettings) -> Result<PyTorchConfig, String> {
    match &spec.config {
        None => PyTorchConfig::from_settings(settings).map_err(|e| e.0),
        Some(c) => PyTorchConfig::parse(c).map_err(|e| e.0),
    }
}

/// Builds the model `spec` names, with an optional memory capacity in bytes (the PyTorch
/// model's per-process limit; the other models find the capacity through the device).
pub fn build(
    spec: &ModelSpec,
    settings: &RawSettings,
    capacity: Option<u64>,
) -> Result<Box<dyn Allocator>, String> {
    let conf = spec.config.as_deref().unwrap_or("");
    let err = |e: super::common::ConfigError| e.0;
    Ok(match spec.name.as_str() {
        "pytorch" => Box::new(PyTorchModel::new(pytorch_config(spec, settings)?, capacity)),
        "cuda-malloc" => Box::new(CudaMallocModel::new(conf).map_err(err)?),
        "bfc" => Box::new(BfcModel::new(BfcConfig::parse(conf).map_err(err)?)),
        "rmm-pool" => Box::new(RmmPoolModel::new(RmmPoolConfig::parse(conf).map_err(err)?)),
        "rmm-arena" => Box::new(RmmArenaModel::new(conf).map_err(err)?),
        "rmm-binning" => Box::new(RmmBinningModel::new(
            RmmBinningConfig::parse(conf).map_err(err)?,
        )),
        "buddy" => Box::new(BuddyModel::new(BuddyConfig::parse(conf).map_err(err)?)),
        "tlsf" => Box::new(TlsfModel::new(TlsfConfig::parse(conf).map_err(err)?)),
        "vmm-stitch" => Box::new(VmmStitchModel::new(conf).map_err(err)?),
        other => {
            return Err(format!(
                "unknown allocator '{other}' (known: {})",
                MODEL_NAMES.join(", ")
            ));
        }
    })
}

/// Parses a `compare` list: `;`-separated `NAME` or `NAME@CONFIG` entries.
pub fn parse_list(list: &str) -> Result<Vec<ModelSpec>, String> {
    let specs: Vec<ModelSpec> = list
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(ModelSpec::parse)
        .collect::<Result<_, _>>()?;
    if specs.is_empty() {
        return Err("the allocator list is empty".to_string());
    }
    Ok(specs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_model_builds_with_its_defaults_and_rejects_unknown_keys() {
        for name in MODEL_NAMES {
            let spec = ModelSpec::parse(name).unwrap();
            let m = build(&spec, &RawSettings::default(), None).unwrap();
            assert_eq!(m.name(), *name);
            assert_eq!(m.config_string(), "");
            let bad = ModelSpec::parse(&format!("{name}@no_such_key:1")).unwrap();
            let e = build(&bad, &RawSettings::default(), None).err().unwrap();
            assert!(e.contains("no_such_key"), "{name}: {e}");
        }
        assert!(ModelSpec::parse("jemalloc").is_err());
        let l = parse_list("pytorch; bfc@allow_growth:False ;").unwrap();
        assert_eq!(l[1].label(), "bfc@allow_growth:False");
        assert!(parse_list(" ; ").is_err());
        for spec in DEFAULT_COMPARE {
            ModelSpec::parse(spec).unwrap();
        }
    }
}
