//! The real GPU: [`Gpu`] over the CUDA driver API through cudarc, the driver library
//! loaded at run time. This is the crate's only module with `unsafe` code; every block
//! says why it is sound.
//!
//! cudarc panics if the library or one of its symbols is missing when a function is first
//! called. [`open`] therefore checks, before calling anything, that `libcuda` loads and
//! that every symbol this module uses is exported, and answers [`Unavailable`] otherwise.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::marker::PhantomData;

use cudarc::driver::sys;

use crate::Unavailable;
use crate::gpu::{DeviceInfo, DevicePtr, Gpu, GpuError, PhysHandle};

/// Every driver symbol this module calls (cudarc loads each on first use and panics if it
/// is missing, so [`open`] checks them all first). Keep in step with the calls below.
const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuGetErrorString",
    "cuGetErrorName",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemGetInfo_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemsetD32_v2",
    "cuMemsetD8_v2",
    "cuMemcpyDtoH_v2",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemGetAllocationGranularity",
];

/// Turns a driver status into a result, naming the call.
fn check(call: &'static str, status: sys::CUresult) -> Result<(), GpuError> {
    match status {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(GpuError::OutOfMemory { call }),
        other => Err(GpuError::Driver {
            call,
            message: describe(other),
        }),
    }
}

/// The driver's name and text for a status (`CUDA_ERROR_NO_DEVICE: no CUDA-capable …`).
fn describe(status: sys::CUresult) -> String {
    let mut name: *const std::ffi::c_char = std::ptr::null();
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: both calls only write a pointer to a static, NUL-terminated string owned by
    // the driver (or leave it null for an unknown status); the symbols were checked in
    // `open` before any call can reach here.
    let (name_ok, text_ok) = unsafe {
        (
            sys::cuGetErrorName(status, &raw mut name),
            sys::cuGetErrorString(status, &raw mut text),
        )
    };
    let read = |ok: sys::CUresult, p: *const std::ffi::c_char| {
        if ok != sys::CUresult::CUDA_SUCCESS || p.is_null() {
            return None;
        }
        // SAFETY: the driver returned a non-null pointer to a static NUL-terminated string.
        Some(
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned(),
        )
    };
    match (read(name_ok, name), read(text_ok, text)) {
        (Some(n), Some(t)) => format!("{n}: {t}"),
        (Some(n), None) => n,
        _ => format!("CUresult {}", status as u32),
    }
}

fn unavailable(reason: impl Into<String>) -> Unavailable {
    Unavailable {
        reason: reason.into(),
    }
}

/// The properties of every physical allocation: pinned device memory on this device.
fn allocation_prop(device: sys::CUdevice) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// One CUDA device, its primary context retained and current on the thread that opened
/// it. Not `Send`: a context is current per thread, so it is used where it was opened
/// (the runner opens it on its own thread). The primary context is released on drop.
pub struct CudaGpu {
    device: sys::CUdevice,
    info: DeviceInfo,
    granularity: u64,
    /// Keeps the type `!Send` and `!Sync` (the context is current on this thread only).
    _thread_bound: PhantomData<*const ()>,
}

impl std::fmt::Debug for CudaGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaGpu")
            .field("info", &self.info)
            .field("granularity", &self.granularity)
            .finish_non_exhaustive()
    }
}

/// The run-time probe: loads the driver, checks its symbols, initialises it and opens
/// device `ordinal` (its primary context, made current on this thread). Everything that
/// can be missing — the library, a symbol, a GPU, the device — is an [`Unavailable`]
/// with the reason, never a panic.
pub fn open(ordinal: u32) -> Result<CudaGpu, Unavailable> {
    // SAFETY: only tries to dlopen the candidate names of libcuda (and drops them again);
    // loading the NVIDIA driver library runs no code of ours.
    if !unsafe { sys::is_culib_present() } {
        return Err(unavailable(
            "no CUDA driver: libcuda.so could not be loaded (is an NVIDIA driver installed?)",
        ));
    }
    // SAFETY: `is_culib_present` just succeeded for the same candidate list, so `culib`
    // finds the library instead of panicking; the library stays loaded for the process.
    let lib = unsafe { sys::culib() };
    for name in REQUIRED_SYMBOLS {
        // SAFETY: looks a symbol up without calling it; the pointer type is never used.
        if unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_err() {
            return Err(unavailable(format!(
                "the CUDA driver is too old: libcuda lacks {name}"
            )));
        }
    }
    // SAFETY: every symbol is present (checked above); cuInit takes flags 0.
    let status = unsafe { sys::cuInit(0) };
    if status == sys::CUresult::CUDA_ERROR_NO_DEVICE {
        return Err(unavailable("no CUDA-capable GPU is present"));
    }
    check("cuInit", status).map_err(|e| unavailable(e.to_string()))?;
    let mut count = 0;
    // SAFETY: writes one int.
    check("cuDeviceGetCount", unsafe {
        sys::cuDeviceGetCount(&raw mut count)
    })
    .map_err(|e| unavailable(e.to_string()))?;
    if count <= 0 {
        return Err(unavailable("no CUDA-capable GPU is present"));
    }
    if i64::from(ordinal) >= i64::from(count) {
        return Err(unavailable(format!(
            "there is no CUDA device {ordinal} (this machine has {count})"
        )));
    }
    let mut device: sys::CUdevice = 0;
    // SAFETY: writes one device handle; the ordinal is in range.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&raw mut device, ordinal as i32)
    })
    .map_err(|e| unavailable(e.to_string()))?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: retains the device's primary context (released in Drop, or below on error).
    check("cuDevicePrimaryCtxRetain", unsafe {
        sys::cuDevicePrimaryCtxRetain(&raw mut ctx, device)
    })
    .map_err(|e| unavailable(e.to_string()))?;
    // From here on the context is owned by `gpu`, whose Drop releases it.
    let mut gpu = CudaGpu {
        device,
        info: DeviceInfo {
            ordinal,
            name: String::new(),
            total_bytes: 0,
            free_bytes_at_start: 0,
        },
        granularity: 2 << 20,
        _thread_bound: PhantomData,
    };
    // SAFETY: `ctx` is the primary context just retained.
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })
        .map_err(|e| unavailable(e.to_string()))?;
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: the driver writes at most `len` bytes, NUL-terminated, into the buffer.
    check("cuDeviceGetName", unsafe {
        sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, device)
    })
    .map_err(|e| unavailable(e.to_string()))?;
    name[name.len() - 1] = 0;
    // SAFETY: the buffer is NUL-terminated (forced above) and lives through the call.
    gpu.info.name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let mut total = 0usize;
    // SAFETY: writes one size.
    check("cuDeviceTotalMem", unsafe {
        sys::cuDeviceTotalMem_v2(&raw mut total, device)
    })
    .map_err(|e| unavailable(e.to_string()))?;
    gpu.info.total_bytes = total as u64;
    let prop = allocation_prop(device);
    let mut granularity = 0usize;
    // SAFETY: `prop` is a fully initialised property struct that outlives the call, which
    // writes one size.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &raw mut granularity,
            &raw const prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })
    .map_err(|e| unavailable(format!("{e} (the device has no virtual memory management)")))?;
    if granularity > 0 {
        gpu.granularity = granularity as u64;
    }
    let (free, _) = gpu.mem_get_info().map_err(|e| unavailable(e.to_string()))?;
    gpu.info.free_bytes_at_start = free;
    Ok(gpu)
}

impl Drop for CudaGpu {
    fn drop(&mut self) {
        // SAFETY: releases the primary context retained in `open` exactly once. The device
        // layer frees every allocation before its `CudaGpu` is dropped (field order and
        // its own Drop), and the driver frees whatever a context still holds when its last
        // reference goes.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
    }
}

impl Gpu for CudaGpu {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_get_info(&self) -> Result<(u64, u64), GpuError> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two sizes; the context is current (opened on this thread, and the
        // type cannot leave it).
        check("cuMemGetInfo", unsafe {
            sys::cuMemGetInfo_v2(&raw mut free, &raw mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    fn granularity(&self) -> u64 {
        self.granularity
    }

    fn alloc(&mut self, bytes: u64) -> Result<DevicePtr, GpuError> {
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: writes one device pointer; no memory of ours is touched.
        check("cuMemAlloc", unsafe {
            sys::cuMemAlloc_v2(&raw mut ptr, bytes as usize)
        })?;
        Ok(ptr)
    }

    fn free(&mut self, ptr: DevicePtr) -> Result<(), GpuError> {
        // SAFETY: the device layer frees only pointers `alloc` returned, each once; a wrong
        // pointer is reported by the driver as an error, not undefined behaviour of ours.
        check("cuMemFree", unsafe { sys::cuMemFree_v2(ptr) })
    }

    fn reserve(&mut self, bytes: u64, alignment: u64) -> Result<DevicePtr, GpuError> {
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: writes one device pointer; reserving address space maps no memory.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&raw mut ptr, bytes as usize, alignment as usize, 0, 0)
        })?;
        Ok(ptr)
    }

    fn address_free(&mut self, ptr: DevicePtr, bytes: u64) -> Result<(), GpuError> {
        // SAFETY: frees a reservation made by `reserve` with its size; nothing is mapped in
        // it any more (the device layer unmaps first).
        check("cuMemAddressFree", unsafe {
            sys::cuMemAddressFree(ptr, bytes as usize)
        })
    }

    fn create(&mut self, bytes: u64) -> Result<PhysHandle, GpuError> {
        let prop = allocation_prop(self.device);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` is fully initialised and outlives the call, which writes one
        // handle.
        check("cuMemCreate", unsafe {
            sys::cuMemCreate(&raw mut handle, bytes as usize, &raw const prop, 0)
        })?;
        Ok(PhysHandle(handle))
    }

    fn release(&mut self, handle: PhysHandle) -> Result<(), GpuError> {
        // SAFETY: releases a handle `create` returned, once.
        check("cuMemRelease", unsafe { sys::cuMemRelease(handle.0) })
    }

    fn map(&mut self, ptr: DevicePtr, bytes: u64, handle: PhysHandle) -> Result<(), GpuError> {
        // SAFETY: maps a whole handle at offset 0 into a reserved, unmapped range.
        check("cuMemMap", unsafe {
            sys::cuMemMap(ptr, bytes as usize, 0, handle.0, 0)
        })
    }

    fn set_access(&mut self, ptr: DevicePtr, bytes: u64) -> Result<(), GpuError> {
        let desc = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.device,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: one fully initialised descriptor that outlives the call; the range is
        // mapped.
        check("cuMemSetAccess", unsafe {
            sys::cuMemSetAccess(ptr, bytes as usize, &raw const desc, 1)
        })
    }

    fn unmap(&mut self, ptr: DevicePtr, bytes: u64) -> Result<(), GpuError> {
        // SAFETY: unmaps a range `map` mapped; no host memory is involved.
        check("cuMemUnmap", unsafe {
            sys::cuMemUnmap(ptr, bytes as usize)
        })
    }

    fn synchronize(&mut self) -> Result<(), GpuError> {
        // SAFETY: waits for the current context; no arguments.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    fn fill(&mut self, ptr: DevicePtr, bytes: u64, word: u32) -> Result<(), GpuError> {
        let words = bytes / 4;
        if words > 0 {
            // SAFETY: writes device memory inside a live allocation the caller names
            // (a block of the model, inside a segment this device holds); no host memory.
            check("cuMemsetD32", unsafe {
                sys::cuMemsetD32_v2(ptr, word, words as usize)
            })?;
        }
        let le = word.to_le_bytes();
        for i in words * 4..bytes {
            // SAFETY: as above, one byte of the same allocation.
            check("cuMemsetD8", unsafe {
                sys::cuMemsetD8_v2(ptr + i, le[(i % 4) as usize], 1)
            })?;
        }
        Ok(())
    }

    fn read(&mut self, ptr: DevicePtr, out: &mut [u8]) -> Result<(), GpuError> {
        if out.is_empty() {
            return Ok(());
        }
        // SAFETY: the driver writes exactly `out.len()` bytes into `out`, which is a live,
        // exclusively borrowed host buffer; the source lies inside a live allocation.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast::<c_void>(), ptr, out.len())
        })
    }
}
