//! allocsim-native: the CUDA device of allocsim — the same allocator models as the
//! simulation, on real GPU memory — and the replay that validates the simulation against
//! it (`allocsim cuda-replay`, the desktop app's live replay).
//!
//! CUDA is optional at three levels (STYLE.md rule 8): the `cuda` cargo feature (without
//! it the crate builds and [`probe`] says CUDA is unavailable); cudarc's dynamic loading,
//! so no CUDA toolkit is needed to build; and a run-time probe, [`probe`] / [`open`], that
//! answers [`Unavailable`] with the reason — never a panic — where there is no driver or
//! GPU. All `unsafe` code is in the `cuda` module.
//!
//! The layers: [`gpu::Gpu`] is the handful of driver calls; [`device::CudaDevice`] is the
//! core's `Device` on top of them (plain and expandable segments, cap, balloon, RAII);
//! [`replay::cuda_replay`] drives a trace through a model on it next to the simulation and
//! builds the report; [`runner::Runner`] runs that on a background thread for the app.

pub mod cost;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod gpu;
pub mod latency;
pub mod raw;
pub mod replay;
pub mod runner;

use std::sync::Arc;

use allocsim_core::trace::Trace;

pub use gpu::{DeviceInfo, Gpu, GpuError};
pub use replay::{CudaReplayOptions, CudaReplayReport, Mode, cuda_replay};
pub use runner::{LiveState, LiveStatus, Message, Runner};

/// The machine cannot run a CUDA replay; `reason` says what is missing (no driver, no
/// GPU, no such device, a build without the `cuda` feature). The CLI exits with 3.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[error("CUDA is unavailable: {reason}")]
pub struct Unavailable {
    pub reason: String,
}

/// Why a CUDA replay did not produce a report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NativeError {
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// Bad options for this trace or device (a balloon larger than the free memory, a
    /// missing trace device).
    #[error("{0}")]
    Config(String),
    /// The model or its config cannot be built.
    #[error(transparent)]
    Model(#[from] allocsim_core::models::ConfigError),
    /// A driver call failed (other than refusing memory) at op `op`; everything held was
    /// given back.
    #[error("op {op} (event {event_index}): {error}")]
    Driver {
        op: usize,
        event_index: u64,
        error: GpuError,
    },
}

/// The real GPU of this build.
#[cfg(feature = "cuda")]
pub type SystemGpu = cuda::CudaGpu;

/// The real GPU of this build: none (built without the `cuda` feature). No value of this
/// type exists.
#[cfg(not(feature = "cuda"))]
#[derive(Debug)]
pub enum SystemGpu {}

#[cfg(not(feature = "cuda"))]
impl Gpu for SystemGpu {
    fn info(&self) -> &DeviceInfo {
        match *self {}
    }
    fn mem_get_info(&self) -> Result<(u64, u64), GpuError> {
        match *self {}
    }
    fn granularity(&self) -> u64 {
        match *self {}
    }
    fn alloc(&mut self, _bytes: u64) -> Result<gpu::DevicePtr, GpuError> {
        match *self {}
    }
    fn free(&mut self, _ptr: gpu::DevicePtr) -> Result<(), GpuError> {
        match *self {}
    }
    fn reserve(&mut self, _bytes: u64, _alignment: u64) -> Result<gpu::DevicePtr, GpuError> {
        match *self {}
    }
    fn address_free(&mut self, _ptr: gpu::DevicePtr, _bytes: u64) -> Result<(), GpuError> {
        match *self {}
    }
    fn create(&mut self, _bytes: u64) -> Result<gpu::PhysHandle, GpuError> {
        match *self {}
    }
    fn release(&mut self, _handle: gpu::PhysHandle) -> Result<(), GpuError> {
        match *self {}
    }
    fn map(
        &mut self,
        _ptr: gpu::DevicePtr,
        _bytes: u64,
        _handle: gpu::PhysHandle,
    ) -> Result<(), GpuError> {
        match *self {}
    }
    fn set_access(&mut self, _ptr: gpu::DevicePtr, _bytes: u64) -> Result<(), GpuError> {
        match *self {}
    }
    fn unmap(&mut self, _ptr: gpu::DevicePtr, _bytes: u64) -> Result<(), GpuError> {
        match *self {}
    }
    fn synchronize(&mut self) -> Result<(), GpuError> {
        match *self {}
    }
    fn fill(&mut self, _ptr: gpu::DevicePtr, _bytes: u64, _word: u32) -> Result<(), GpuError> {
        match *self {}
    }
    fn read(&mut self, _ptr: gpu::DevicePtr, _out: &mut [u8]) -> Result<(), GpuError> {
        match *self {}
    }
}

/// Opens CUDA device `ordinal` on this thread (its context becomes current here).
pub fn open(ordinal: u32) -> Result<SystemGpu, Unavailable> {
    #[cfg(feature = "cuda")]
    {
        cuda::open(ordinal)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err(Unavailable {
            reason: "this build of allocsim has no CUDA support (cargo feature `cuda`)".to_string(),
        })
    }
}

/// Whether CUDA device `ordinal` can be used here, and what it is (opens and closes it).
pub fn probe(ordinal: u32) -> Result<DeviceInfo, Unavailable> {
    open(ordinal).map(|g| g.info().clone())
}

/// Runs [`cuda_replay`] on CUDA device `ordinal`, opened on this thread.
pub fn cuda_replay_on(
    ordinal: u32,
    trace: &Trace,
    opts: &CudaReplayOptions,
    obs: &mut dyn replay::Observer,
) -> Result<CudaReplayReport, NativeError> {
    let gpu = open(ordinal)?;
    cuda_replay(gpu, trace, opts, obs)
}

/// Starts a live replay on CUDA device `ordinal` on a background thread (see [`Runner`]);
/// without CUDA the runner's only message is `Unavailable`.
pub fn spawn_live(
    ordinal: u32,
    trace: Arc<Trace>,
    opts: CudaReplayOptions,
) -> std::io::Result<Runner> {
    Runner::spawn(move || open(ordinal), trace, opts)
}
