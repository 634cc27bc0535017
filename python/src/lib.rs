//! `allocsim._native`: the Python package's one native module. It runs the command line's
//! own code (`allocsim_app::cli::api`): a command's `--json` object for a snapshot on disk
//! or in memory, and the whole `allocsim` command in this process (the wheel's console
//! script). Errors are `AllocsimError` carrying the CLI's one-line message and exit code.
//! The Python side (`allocsim/__init__.py`) turns keyword arguments into the CLI's options.

use std::path::Path;

use allocsim_app::cli::api;
use allocsim_app::cli::{Failure, InMemory};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    _native,
    AllocsimError,
    PyException,
    "An allocsim error: the command line's one-line message (`exit_code`: 2 bad input, 3 the machine lacks what is needed)."
);

/// The Python exception for a CLI failure: its message, with `exit_code` set.
fn error(py: Python<'_>, f: Failure) -> PyErr {
    let e = AllocsimError::new_err(f.message);
    // Setting an attribute on a fresh exception object cannot fail in practice; if it
    // did, the message alone still reaches the caller.
    let _ = e.value(py).setattr("exit_code", f.code);
    e
}

/// A decoded snapshot (what `allocsim.load` returns): its bytes and its trace, named
/// `name` in every message and in `validate`'s `file`.
#[pyclass(frozen, module = "allocsim._native")]
pub struct Snapshot {
    memory: InMemory,
    #[pyo3(get)]
    name: String,
}

#[pymethods]
impl Snapshot {
    /// The snapshot's size in bytes as it was read (compressed or not).
    #[getter]
    fn nbytes(&self) -> usize {
        self.memory.bytes.len()
    }

    /// The number of events of each `device_traces[D]`.
    #[getter]
    fn device_events(&self) -> Vec<usize> {
        self.memory
            .decoded
            .as_ref()
            .map(|v| v.trace.devices.iter().map(|d| d.events).collect())
            .unwrap_or_default()
    }

    /// Whether allocsim's PyTorch model reproduces every device of the recording exactly
    /// (`allocsim validate`'s `exact`).
    #[getter]
    fn exact(&self) -> bool {
        self.memory.decoded.as_ref().is_some_and(|v| v.exact())
    }

    fn __repr__(&self) -> String {
        format!(
            "<allocsim.Snapshot {:?}: {} bytes, events per device {:?}>",
            self.name,
            self.memory.bytes.len(),
            self.device_events()
        )
    }
}

/// Decodes a snapshot's bytes (pickle, JSON, gzip of either), named `name` in messages.
#[pyfunction]
fn decode(py: Python<'_>, data: Vec<u8>, name: String) -> PyResult<Snapshot> {
    let memory = py
        .detach(|| api::decode(data, &name))
        .map_err(|f| error(py, f))?;
    Ok(Snapshot { memory, name })
}

/// Reads and decodes the snapshot at `path` (errors as the CLI gives them for FILE).
#[pyfunction]
fn read(py: Python<'_>, path: String) -> PyResult<Snapshot> {
    let memory = py
        .detach(|| {
            let bytes = std::fs::read(Path::new(&path))
                .map_err(|e| Failure::bad_input(format!("{path}: cannot read: {e}")))?;
            api::decode(bytes, &path)
        })
        .map_err(|f| error(py, f))?;
    Ok(Snapshot { memory, name: path })
}

/// Runs `args` (a command, FILE and options as on the command line) and returns its
/// `--json` object as JSON text; with `snapshot`, FILE names it and it is not read.
#[pyfunction]
#[pyo3(signature = (args, snapshot=None))]
#[allow(clippy::needless_pass_by_value)] // pyo3 hands over an owned list
fn run_json(py: Python<'_>, args: Vec<String>, snapshot: Option<&Snapshot>) -> PyResult<String> {
    let memory = snapshot.map(|s| &s.memory);
    py.detach(|| {
        let v = api::json(&args, memory)?;
        serde_json::to_string(&v)
            .map_err(|e| Failure::bad_input(format!("cannot write the JSON: {e}")))
    })
    .map_err(|f| error(py, f))
}

/// Runs a command of several snapshots (`diff`, `ranks`): `snapshots[i]`, when not None,
/// is the snapshot the i-th FILE argument names (not read); the others are read.
#[pyfunction]
#[allow(clippy::needless_pass_by_value)] // pyo3 hands over owned lists
fn run_json_many(
    py: Python<'_>,
    args: Vec<String>,
    snapshots: Vec<Option<PyRef<'_, Snapshot>>>,
) -> PyResult<String> {
    let memory: Vec<Option<InMemory>> = snapshots
        .iter()
        .map(|s| s.as_ref().map(|s| s.memory.clone()))
        .collect();
    py.detach(|| {
        let refs: Vec<Option<&InMemory>> = memory.iter().map(Option::as_ref).collect();
        let v = api::json_many(&args, &refs)?;
        serde_json::to_string(&v)
            .map_err(|e| Failure::bad_input(format!("cannot write the JSON: {e}")))
    })
    .map_err(|f| error(py, f))
}

/// The `allocsim` command line on `argv` (the program's name first) in this process;
/// returns its exit code.
#[pyfunction]
fn main(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| allocsim_app::cli::main_from(argv))
}

/// The commands `run_json` runs.
#[pyfunction]
fn commands() -> Vec<&'static str> {
    api::COMMANDS.to_vec()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("AllocsimError", m.py().get_type::<AllocsimError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<Snapshot>()?;
    m.add_function(wrap_pyfunction!(decode, m)?)?;
    m.add_function(wrap_pyfunction!(read, m)?)?;
    m.add_function(wrap_pyfunction!(run_json, m)?)?;
    m.add_function(wrap_pyfunction!(run_json_many, m)?)?;
    m.add_function(wrap_pyfunction!(main, m)?)?;
    m.add_function(wrap_pyfunction!(commands, m)?)?;
    Ok(())
}
