//! The driver operations the CUDA device is built from, behind one small trait: the real
//! implementation is [`crate::cuda::CudaGpu`] (cudarc, the only place with `unsafe`); the
//! replay driver, the device bookkeeping and the runner are written against the trait, so
//! they are tested without a GPU too.

/// A device (virtual) address.
pub type DevicePtr = u64;

/// A physical allocation made by `cuMemCreate`, mapped into a reservation by `cuMemMap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PhysHandle(pub u64);

/// What the replay reports about the GPU it ran on.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceInfo {
    /// The CUDA device ordinal (`--device N`).
    pub ordinal: u32,
    /// The device name as the driver reports it (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// `cuDeviceTotalMem`.
    pub total_bytes: u64,
    /// `cuMemGetInfo`'s free memory when the device was opened (before any balloon).
    pub free_bytes_at_start: u64,
}

/// A driver call that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// `CUDA_ERROR_OUT_OF_MEMORY`: the driver refused the memory. The only error a replay
    /// treats as an outcome rather than a failure.
    #[error("{call}: out of memory")]
    OutOfMemory { call: &'static str },
    /// Any other failure of a driver call.
    #[error("{call} failed: {message}")]
    Driver { call: &'static str, message: String },
}

impl GpuError {
    /// Whether the driver refused memory (as opposed to failing).
    #[must_use]
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, GpuError::OutOfMemory { .. })
    }
}

/// The driver operations of one GPU, in a context that is current on the calling thread.
///
/// Every method is one driver call (or the fixed few that make one logical operation, as
/// documented), so the device layer can time each. Implementations never panic.
pub trait Gpu {
    /// The device this is.
    fn info(&self) -> &DeviceInfo;
    /// `cuMemGetInfo`: `(free, total)` bytes of the whole device.
    fn mem_get_info(&self) -> Result<(u64, u64), GpuError>;
    /// The VMM allocation granularity (`cuMemGetAllocationGranularity`, minimum): the page
    /// every physical allocation and mapping is a multiple of (`2 MiB` on current GPUs).
    fn granularity(&self) -> u64;
    /// `cuMemAlloc`.
    fn alloc(&mut self, bytes: u64) -> Result<DevicePtr, GpuError>;
    /// `cuMemFree` of a pointer from [`Gpu::alloc`].
    fn free(&mut self, ptr: DevicePtr) -> Result<(), GpuError>;
    /// `cuMemAddressReserve`: virtual address space, no memory.
    fn reserve(&mut self, bytes: u64, alignment: u64) -> Result<DevicePtr, GpuError>;
    /// `cuMemAddressFree` of a whole reservation (nothing may be mapped in it).
    fn address_free(&mut self, ptr: DevicePtr, bytes: u64) -> Result<(), GpuError>;
    /// `cuMemCreate`: physical memory of `bytes` (a multiple of the granularity).
    fn create(&mut self, bytes: u64) -> Result<PhysHandle, GpuError>;
    /// `cuMemRelease` of a handle (its memory returns once it is unmapped too).
    fn release(&mut self, handle: PhysHandle) -> Result<(), GpuError>;
    /// `cuMemMap` of the whole handle at `ptr`.
    fn map(&mut self, ptr: DevicePtr, bytes: u64, handle: PhysHandle) -> Result<(), GpuError>;
    /// `cuMemSetAccess`: read/write access for this device to `[ptr, ptr + bytes)`.
    fn set_access(&mut self, ptr: DevicePtr, bytes: u64) -> Result<(), GpuError>;
    /// `cuMemUnmap` of `[ptr, ptr + bytes)`.
    fn unmap(&mut self, ptr: DevicePtr, bytes: u64) -> Result<(), GpuError>;
    /// `cuCtxSynchronize` (PyTorch synchronizes before unmapping pages).
    fn synchronize(&mut self) -> Result<(), GpuError>;
    /// Fills `[ptr, ptr + bytes)` with `word`'s little-endian bytes repeated from `ptr` on
    /// (`cuMemsetD32`, then `cuMemsetD8` for a tail shorter than a word). `ptr` is 4-byte
    /// aligned.
    fn fill(&mut self, ptr: DevicePtr, bytes: u64, word: u32) -> Result<(), GpuError>;
    /// `cuMemcpyDtoH` of `out.len()` bytes from `ptr`.
    fn read(&mut self, ptr: DevicePtr, out: &mut [u8]) -> Result<(), GpuError>;
}
