//! The typed contract for choosing a model: [`AllocatorKind`] names every model (serde and
//! the CLI spell it alike), [`ModelSpec`] is a kind and its config, and
//! [`ModelSpec::resolve`] parses the config once into a [`ResolvedModel`] that builds the
//! model (the PyTorch config it holds is the one the replay's device is sized from too).

use std::fmt;
use std::str::FromStr;

use super::Allocator;
use super::bfc::{BfcConfig, BfcModel};
use super::buddy::{BuddyConfig, BuddyModel};
use super::common::ConfigError;
use super::cuda_malloc::CudaMallocModel;
use super::pytorch::{PyTorchConfig, PyTorchModel};
use super::rmm_arena::RmmArenaModel;
use super::rmm_binning::{RmmBinningConfig, RmmBinningModel};
use super::rmm_pool::{RmmPoolConfig, RmmPoolModel};
use super::tlsf::{TlsfConfig, TlsfModel};
use super::vmm_stitch::VmmStitchModel;
use crate::snapshot::RawSettings;

/// Every allocator model, by the name the CLI, the JSON and serde use (`pytorch`,
/// `cuda-malloc`, …).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum AllocatorKind {
    /// PyTorch's CUDA caching allocator (`models::pytorch`).
    Pytorch,
    /// No caching: a `cudaMalloc` per request (`models::cuda_malloc`).
    CudaMalloc,
    /// TensorFlow's best-fit with coalescing (`models::bfc`).
    Bfc,
    /// RMM's `pool_memory_resource` (`models::rmm_pool`).
    RmmPool,
    /// RMM's `arena_memory_resource` (`models::rmm_arena`).
    RmmArena,
    /// RMM's `binning_memory_resource` (`models::rmm_binning`).
    RmmBinning,
    /// A binary buddy allocator (`models::buddy`).
    Buddy,
    /// Two-level segregated fit (`models::tlsf`).
    Tlsf,
    /// VMM page stitching (`models::vmm_stitch`).
    VmmStitch,
}

impl AllocatorKind {
    /// Every model, in the order the CLI and the app list them.
    pub const ALL: [AllocatorKind; 9] = [
        AllocatorKind::Pytorch,
        AllocatorKind::CudaMalloc,
        AllocatorKind::Bfc,
        AllocatorKind::RmmPool,
        AllocatorKind::RmmArena,
        AllocatorKind::RmmBinning,
        AllocatorKind::Buddy,
        AllocatorKind::Tlsf,
        AllocatorKind::VmmStitch,
    ];

    /// The name as the CLI spells it.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            AllocatorKind::Pytorch => "pytorch",
            AllocatorKind::CudaMalloc => "cuda-malloc",
            AllocatorKind::Bfc => "bfc",
            AllocatorKind::RmmPool => "rmm-pool",
            AllocatorKind::RmmArena => "rmm-arena",
            AllocatorKind::RmmBinning => "rmm-binning",
            AllocatorKind::Buddy => "buddy",
            AllocatorKind::Tlsf => "tlsf",
            AllocatorKind::VmmStitch => "vmm-stitch",
        }
    }

    /// Every model's name, in [`AllocatorKind::ALL`]'s order.
    #[must_use]
    pub fn names() -> Vec<&'static str> {
        AllocatorKind::ALL.iter().map(|k| k.name()).collect()
    }
}

impl fmt::Display for AllocatorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AllocatorKind {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<AllocatorKind, ConfigError> {
        AllocatorKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| ConfigError::UnknownAllocator {
                name: s.to_string(),
            })
    }
}

/// The models the CLI and the app know, by the names the CLI uses ([`AllocatorKind::ALL`]'s
/// names).
pub const MODEL_NAMES: &[&str] = &[
    AllocatorKind::Pytorch.name(),
    AllocatorKind::CudaMalloc.name(),
    AllocatorKind::Bfc.name(),
    AllocatorKind::RmmPool.name(),
    AllocatorKind::RmmArena.name(),
    AllocatorKind::RmmBinning.name(),
    AllocatorKind::Buddy.name(),
    AllocatorKind::Tlsf.name(),
    AllocatorKind::VmmStitch.name(),
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

/// A model and its configuration (`NAME` or `NAME@CONFIG` in `compare` lists); serialises
/// as `{"kind": "bfc", "config": "allow_growth:False"}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ModelSpec {
    pub kind: AllocatorKind,
    /// `None`: the model's defaults (for `pytorch`: the snapshot's own settings).
    pub config: Option<String>,
}

impl ModelSpec {
    /// `kind` with its defaults.
    #[must_use]
    pub fn new(kind: AllocatorKind) -> ModelSpec {
        ModelSpec { kind, config: None }
    }

    /// `kind` with `config` (PyTorch's `key:value,…` syntax).
    #[must_use]
    pub fn with_config(kind: AllocatorKind, config: impl Into<String>) -> ModelSpec {
        ModelSpec {
            kind,
            config: Some(config.into()),
        }
    }

    /// Parses `NAME` or `NAME@CONFIG` (the config is checked when the model is built).
    pub fn parse(s: &str) -> Result<ModelSpec, ConfigError> {
        let (name, config) = match s.split_once('@') {
            Some((n, c)) => (n.trim(), Some(c.trim().to_string())),
            None => (s.trim(), None),
        };
        Ok(ModelSpec {
            kind: name.parse()?,
            config,
        })
    }

    /// `NAME` or `NAME@CONFIG`, as parsed.
    #[must_use]
    pub fn label(&self) -> String {
        match &self.config {
            Some(c) => format!("{}@{c}", self.kind),
            None => self.kind.name().to_string(),
        }
    }

    /// Parses the config once, for a snapshot with `settings` (the PyTorch model's default
    /// is the snapshot's own settings).
    pub fn resolve(&self, settings: &RawSettings) -> Result<ResolvedModel, ConfigError> {
        let conf = self.config.as_deref().unwrap_or("");
        Ok(match self.kind {
            AllocatorKind::Pytorch => ResolvedModel::Pytorch(match &self.config {
                None => PyTorchConfig::from_settings(settings)?,
                Some(c) => PyTorchConfig::parse(c)?,
            }),
            AllocatorKind::CudaMalloc => ResolvedModel::CudaMalloc(CudaMallocModel::new(conf)?),
            AllocatorKind::Bfc => ResolvedModel::Bfc(BfcConfig::parse(conf)?),
            AllocatorKind::RmmPool => ResolvedModel::RmmPool(RmmPoolConfig::parse(conf)?),
            AllocatorKind::RmmArena => ResolvedModel::RmmArena(RmmArenaModel::new(conf)?),
            AllocatorKind::RmmBinning => ResolvedModel::RmmBinning(RmmBinningConfig::parse(conf)?),
            AllocatorKind::Buddy => ResolvedModel::Buddy(BuddyConfig::parse(conf)?),
            AllocatorKind::Tlsf => ResolvedModel::Tlsf(TlsfConfig::parse(conf)?),
            AllocatorKind::VmmStitch => ResolvedModel::VmmStitch(VmmStitchModel::new(conf)?),
        })
    }

    /// Builds the model, with an optional memory capacity in bytes (the PyTorch model's
    /// per-process limit; the other models find the capacity through the device).
    pub fn build(
        &self,
        settings: &RawSettings,
        capacity: Option<u64>,
    ) -> Result<Box<dyn Allocator>, ConfigError> {
        Ok(self.resolve(settings)?.build(capacity))
    }
}

impl fmt::Display for ModelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

impl FromStr for ModelSpec {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<ModelSpec, ConfigError> {
        ModelSpec::parse(s)
    }
}

/// A spec whose config has been parsed: each model's parsed config (or, for the models
/// without options, the empty model itself).
#[derive(Debug, Clone)]
pub enum ResolvedModel {
    Pytorch(PyTorchConfig),
    CudaMalloc(CudaMallocModel),
    Bfc(BfcConfig),
    RmmPool(RmmPoolConfig),
    RmmArena(RmmArenaModel),
    RmmBinning(RmmBinningConfig),
    Buddy(BuddyConfig),
    Tlsf(TlsfConfig),
    VmmStitch(VmmStitchModel),
}

impl ResolvedModel {
    /// The PyTorch config, for the PyTorch model.
    #[must_use]
    pub fn pytorch_config(&self) -> Option<&PyTorchConfig> {
        match self {
            ResolvedModel::Pytorch(c) => Some(c),
            _ => None,
        }
    }

    /// The model, empty (see [`ModelSpec::build`] for `capacity`).
    #[must_use]
    pub fn build(self, capacity: Option<u64>) -> Box<dyn Allocator> {
        match self {
            ResolvedModel::Pytorch(c) => Box::new(PyTorchModel::new(c, capacity)),
            ResolvedModel::CudaMalloc(m) => Box::new(m),
            ResolvedModel::Bfc(c) => Box::new(BfcModel::new(c)),
            ResolvedModel::RmmPool(c) => Box::new(RmmPoolModel::new(c)),
            ResolvedModel::RmmArena(m) => Box::new(m),
            ResolvedModel::RmmBinning(c) => Box::new(RmmBinningModel::new(c)),
            ResolvedModel::Buddy(c) => Box::new(BuddyModel::new(c)),
            ResolvedModel::Tlsf(c) => Box::new(TlsfModel::new(c)),
            ResolvedModel::VmmStitch(m) => Box::new(m),
        }
    }
}

/// Parses a `compare` list: `;`-separated `NAME` or `NAME@CONFIG` entries.
pub fn parse_list(list: &str) -> Result<Vec<ModelSpec>, String> {
    let specs: Vec<ModelSpec> = list
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(ModelSpec::parse)
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
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
        for kind in AllocatorKind::ALL {
            let spec = ModelSpec::parse(kind.name()).unwrap();
            assert_eq!(spec, ModelSpec::new(kind));
            let m = spec.build(&RawSettings::default(), None).unwrap();
            assert_eq!(m.name(), kind.name());
            assert_eq!(m.config_string(), "");
            let bad = ModelSpec::parse(&format!("{kind}@no_such_key:1")).unwrap();
            let e = bad.build(&RawSettings::default(), None).err().unwrap();
            assert!(e.to_string().contains("no_such_key"), "{kind}: {e}");
        }
        assert_eq!(MODEL_NAMES, AllocatorKind::names());
        assert!(matches!(
            ModelSpec::parse("jemalloc"),
            Err(ConfigError::UnknownAllocator { name }) if name == "jemalloc"
        ));
        let l = parse_list("pytorch; bfc@allow_growth:False ;").unwrap();
        assert_eq!(l[1].label(), "bfc@allow_growth:False");
        assert!(parse_list(" ; ").is_err());
        for spec in DEFAULT_COMPARE {
            ModelSpec::parse(spec).unwrap();
        }
    }

    /// A model's effective config names only what differs from its defaults, in the
    /// model's own key order whatever order it was given in (the strings `main` printed
    /// before the canonical strings were built by `common::join_options`).
    #[test]
    fn effective_configs_name_what_differs_in_the_models_order() {
        for (spec, effective) in [
            (
                "buddy@heap_size_mb:64,min_block:1024",
                "min_block:1024,heap_size_mb:64",
            ),
            ("buddy@min_block:512,heap_size_mb:256", ""),
            ("tlsf@pool_size_mb:128,sli:5", "sli:5,pool_size_mb:128"),
            (
                "rmm-binning@blocks_to_preallocate:64,min_size_exponent:16",
                "min_size_exponent:16,blocks_to_preallocate:64",
            ),
            (
                "rmm-pool@maximum_pool_size_mb:128,initial_pool_size_mb:64",
                "initial_pool_size_mb:64,maximum_pool_size_mb:128",
            ),
            (
                "bfc@garbage_collection:True,allow_growth:False,fragmentation_fraction:0.5",
                "allow_growth:False,garbage_collection:True,fragmentation_fraction:0.5",
            ),
        ] {
            let m = ModelSpec::parse(spec)
                .unwrap()
                .build(&RawSettings::default(), None)
                .unwrap();
            assert_eq!(m.config_string(), effective, "{spec}");
        }
        let e = ModelSpec::parse("buddy@heap_size_mb:48")
            .unwrap()
            .build(&RawSettings::default(), None)
            .err()
            .unwrap();
        assert!(e.to_string().contains("a power of two"), "{e}");
    }

    #[test]
    fn specs_serialise_with_the_cli_names() {
        let spec = ModelSpec::with_config(AllocatorKind::RmmPool, "initial_pool_size_mb:2");
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(
            json,
            r#"{"kind":"rmm-pool","config":"initial_pool_size_mb:2"}"#
        );
        assert_eq!(serde_json::from_str::<ModelSpec>(&json).unwrap(), spec);
        for kind in AllocatorKind::ALL {
            let s = serde_json::to_string(&kind).unwrap();
            assert_eq!(s, format!("\"{kind}\""));
        }
    }
}
