//! Building any model at run time from its name and a config string.

use super::Allocator;
use super::pytorch::{PyTorchConfig, PyTorchModel};
use crate::snapshot::RawSettings;

/// The models the CLI and the app know, by the names the CLI uses.
pub const MODEL_NAMES: &[&str] = &["pytorch"];

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
            return Err(format!("unknown allocator '{name}' (known: {})", MODEL_NAMES.join(", ")));
        }
        Ok(ModelSpec { name: name.to_string(), config })
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

/// Builds the model `spec` names, with an optional memory capacity in bytes.
pub fn build(spec: &ModelSpec, settings: &RawSettings, capacity: Option<u64>) -> Result<Box<dyn Allocator>, String> {
    match spec.name.as_str() {
        "pytorch" => Ok(Box::new(PyTorchModel::new(pytorch_config(spec, settings)?, capacity))),
        other => Err(format!("unknown allocator '{other}' (known: {})", MODEL_NAMES.join(", "))),
    }
}
