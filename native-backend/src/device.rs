//! The CUDA device: the core's [`Device`] on real GPU memory. Plain segments are
//! `cuMemAlloc`/`cuMemFree`; expandable segments are a `cuMemAddressReserve`d range whose
//! pages are `cuMemCreate` + `cuMemMap` + `cuMemSetAccess`ed and `cuMemUnmap` +
//! `cuMemRelease`d exactly as the model asks, one physical allocation per page as PyTorch
//! does. It refuses beyond an optional cap (like PyTorch's memory fraction) and wherever
//! the driver itself refuses; a balloon can leave the driver only N bytes to give.
//!
//! Everything it holds — segments, pages, reservations, the balloon — is freed when it is
//! dropped, also while a panic unwinds, so a replay never leaks device memory.

use std::collections::BTreeMap;
use std::time::Instant;

use allocsim_core::device::{Device, DeviceOom};

use crate::gpu::{DevicePtr, Gpu, GpuError, PhysHandle};
use crate::latency::{CallKind, Latencies};

/// An expandable segment's address range.
#[derive(Debug)]
struct Reservation {
    /// Bytes of address space.
    size: u64,
    /// The page the model maps in (a multiple of the driver granularity).
    page: u64,
    /// Mapped pages: page address → its physical allocation.
    pages: BTreeMap<DevicePtr, PhysHandle>,
}

/// The first request the driver refused, and what `cuMemGetInfo` said was free right
/// after: the driver may refuse with more than the request still reported free (it keeps
/// memory for itself), which is where a simulation that trusts the free memory differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Refusal {
    /// Bytes the refused call asked for (a segment, or one page of a map).
    pub requested_bytes: u64,
    /// `cuMemGetInfo` free bytes right after the refusal.
    pub free_bytes: u64,
}

/// The core's device interface on a real GPU (see the module docs).
#[derive(Debug)]
pub struct CudaDevice<G: Gpu> {
    gpu: G,
    /// Refuse segments beyond this many bytes held (None: only the driver refuses).
    cap_bytes: Option<u64>,
    /// Bytes held from the driver: plain segments rounded up to the granularity, plus
    /// mapped pages. Always the sum over `segments` and `reservations`.
    used_bytes: u64,
    /// Plain segments: address → size asked for.
    segments: BTreeMap<DevicePtr, u64>,
    /// Expandable segments by base address.
    reservations: BTreeMap<DevicePtr, Reservation>,
    /// The balloon's allocations (address, size), freed last.
    balloon: Vec<(DevicePtr, u64)>,
    latencies: Latencies,
    /// Segment requests the driver refused (`CUDA_ERROR_OUT_OF_MEMORY`).
    driver_refusals: u64,
    /// The first of them.
    first_refusal: Option<Refusal>,
    /// Segment requests refused by the cap before reaching the driver.
    cap_refusals: u64,
    /// The first driver failure that was not a refusal. The core's device interface has
    /// no error channel for frees, so the replay checks this after every op and stops.
    fault: Option<GpuError>,
}

impl<G: Gpu> CudaDevice<G> {
    /// A device on `gpu`, refusing beyond `cap_bytes` held (None: no cap).
    #[must_use]
    pub fn new(gpu: G, cap_bytes: Option<u64>) -> CudaDevice<G> {
        CudaDevice {
            gpu,
            cap_bytes,
            used_bytes: 0,
            segments: BTreeMap::new(),
            reservations: BTreeMap::new(),
            balloon: Vec::new(),
            latencies: Latencies::default(),
            driver_refusals: 0,
            first_refusal: None,
            cap_refusals: 0,
            fault: None,
        }
    }

    /// The GPU (for reads and writes of the replay's blocks).
    pub fn gpu_mut(&mut self) -> &mut G {
        &mut self.gpu
    }

    /// The GPU.
    #[must_use]
    pub fn gpu(&self) -> &G {
        &self.gpu
    }

    /// Bytes this device holds from the driver for the model (not the balloon).
    #[must_use]
    pub fn held_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Timings of every driver call made for the model.
    #[must_use]
    pub fn latencies(&self) -> &Latencies {
        &self.latencies
    }

    /// Segment requests the driver refused so far.
    #[must_use]
    pub fn driver_refusals(&self) -> u64 {
        self.driver_refusals
    }

    /// The first refusal of the driver, with the free memory it left.
    #[must_use]
    pub fn first_refusal(&self) -> Option<Refusal> {
        self.first_refusal
    }

    /// Counts a refusal of the driver to a call that asked for `requested_bytes`.
    fn refused(&mut self, requested_bytes: u64) {
        self.driver_refusals += 1;
        if self.first_refusal.is_none() {
            let free_bytes = self.gpu.mem_get_info().map_or(0, |(f, _)| f);
            self.first_refusal = Some(Refusal {
                requested_bytes,
                free_bytes,
            });
        }
    }

    /// Segment requests the cap refused so far.
    #[must_use]
    pub fn cap_refusals(&self) -> u64 {
        self.cap_refusals
    }

    /// The first driver failure (not a refusal), if any.
    #[must_use]
    pub fn fault(&self) -> Option<&GpuError> {
        self.fault.as_ref()
    }

    /// Bytes the balloon holds.
    #[must_use]
    pub fn balloon_bytes(&self) -> u64 {
        self.balloon.iter().map(|&(_, s)| s).sum()
    }

    fn round_to_granularity(&self, bytes: u64) -> u64 {
        let g = self.gpu.granularity().max(1);
        bytes.div_ceil(g) * g
    }

    /// A driver call for `requested_bytes` failed: a refusal when the driver is out of
    /// memory (counted, see [`Self::refused`]), else a fault noted; the model sees an OOM
    /// either way.
    fn failed(&mut self, e: GpuError, requested_bytes: u64) -> DeviceOom {
        if e.is_out_of_memory() {
            self.refused(requested_bytes);
        } else {
            self.note(e);
        }
        DeviceOom
    }

    fn note(&mut self, e: GpuError) {
        if self.fault.is_none() {
            self.fault = Some(e);
        }
    }

    fn cap_allows(&mut self, bytes: u64) -> bool {
        match self.cap_bytes {
            Some(cap) if self.used_bytes.saturating_add(bytes) > cap => {
                self.cap_refusals += 1;
                false
            }
            _ => true,
        }
    }

    /// Fills the GPU so that only `leave_free_bytes` (to within the driver granularity)
    /// stay free: `cuMemAlloc`s of halving sizes until `cuMemGetInfo` says so. Returns the
    /// free bytes it left. Errors if less than that is free to begin with.
    pub fn inflate_balloon(&mut self, leave_free_bytes: u64) -> Result<u64, GpuError> {
        let g = self.gpu.granularity().max(1);
        let mut chunk: u64 = 1 << 36;
        loop {
            let (free, _) = self.gpu.mem_get_info()?;
            let excess = free.saturating_sub(leave_free_bytes) / g * g;
            if excess == 0 {
                return Ok(free);
            }
            let size = excess.min(chunk);
            match self.gpu.alloc(size) {
                Ok(p) => self.balloon.push((p, size)),
                Err(e) if e.is_out_of_memory() => {
                    if chunk <= g {
                        // Not even one page more can be had: that is as full as it gets.
                        return Ok(free);
                    }
                    chunk = (chunk / 2).max(g);
                }
                Err(e) => return Err(e),
            }
            chunk = chunk.min(size);
        }
    }

    /// Measures how much of the free memory the driver really hands out now: takes
    /// `cuMemAlloc`s of halving sizes down to one page of the granularity until the driver
    /// refuses a single page, then gives all of it back. The driver keeps some memory it
    /// reports free for itself, and how much differs between GPUs (one 2 MiB page on an
    /// H200, two on an H100 with the same driver), so a simulation compared with the GPU
    /// gets this measured figure rather than a rule.
    pub fn probe_usable_bytes(&mut self) -> Result<u64, GpuError> {
        let g = self.gpu.granularity().max(1);
        let (free, _) = self.gpu.mem_get_info()?;
        let mut chunk = (free / g).max(1) * g;
        let mut taken: Vec<DevicePtr> = Vec::new();
        let mut total = 0u64;
        let outcome = loop {
            match self.gpu.alloc(chunk) {
                Ok(p) => {
                    taken.push(p);
                    total += chunk;
                }
                Err(e) if e.is_out_of_memory() => {
                    if chunk <= g {
                        break Ok(total);
                    }
                    chunk = (chunk / 2 / g).max(1) * g;
                }
                Err(e) => break Err(e),
            }
        };
        let mut first_error = None;
        for p in taken {
            if let Err(e) = self.gpu.free(p) {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => outcome,
        }
    }

    /// Frees everything the device holds (segments, pages, reservations, the balloon),
    /// going on past failures; returns the first. Dropping the device does the same.
    pub fn release_all(&mut self) -> Result<(), GpuError> {
        let mut first: Option<GpuError> = None;
        let mut keep = |r: Result<(), GpuError>| {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        };
        if !self.reservations.is_empty() {
            keep(self.gpu.synchronize());
        }
        for (ptr, _) in std::mem::take(&mut self.segments) {
            keep(self.gpu.free(ptr));
        }
        for (base, r) in std::mem::take(&mut self.reservations) {
            for (p, h) in r.pages {
                keep(self.gpu.unmap(p, r.page));
                keep(self.gpu.release(h));
            }
            keep(self.gpu.address_free(base, r.size));
        }
        for (ptr, _) in std::mem::take(&mut self.balloon) {
            keep(self.gpu.free(ptr));
        }
        self.used_bytes = 0;
        first.map_or(Ok(()), Err)
    }

    /// The reservation holding `addr`, as (base, page).
    fn reservation_of(&self, addr: DevicePtr) -> Option<(DevicePtr, u64)> {
        let (&base, r) = self.reservations.range(..=addr).next_back()?;
        (addr < base + r.size).then_some((base, r.page))
    }
}

impl<G: Gpu> Drop for CudaDevice<G> {
    fn drop(&mut self) {
        // Runs on normal exit, on early returns with an error and while a panic unwinds:
        // the driver gets every byte back before the context is released (`gpu` is
        // dropped after this).
        let _ = self.release_all();
    }
}

impl<G: Gpu> Device for CudaDevice<G> {
    fn malloc(&mut self, size: u64, _stream: u64) -> Result<u64, DeviceOom> {
        let held = self.round_to_granularity(size);
        if !self.cap_allows(held) {
            return Err(DeviceOom);
        }
        let t = Instant::now();
        let r = self.gpu.alloc(size);
        self.latencies.record(CallKind::Alloc, t.elapsed());
        match r {
            Ok(p) => {
                self.segments.insert(p, size);
                self.used_bytes += held;
                Ok(p)
            }
            Err(e) => Err(self.failed(e, size)),
        }
    }

    fn free(&mut self, addr: u64, _size: u64) {
        let Some(size) = self.segments.remove(&addr) else {
            self.note(GpuError::Driver {
                call: "cuMemFree",
                message: format!("{addr:#x} is no segment of this device"),
            });
            return;
        };
        self.used_bytes -= self.round_to_granularity(size);
        let t = Instant::now();
        let r = self.gpu.free(addr);
        self.latencies.record(CallKind::Free, t.elapsed());
        if let Err(e) = r {
            self.note(e);
        }
    }

    fn reserve(&mut self, size: u64, page: u64, _stream: u64) -> Result<u64, DeviceOom> {
        let g = self.gpu.granularity().max(1);
        if page == 0 || !page.is_multiple_of(g) || !size.is_multiple_of(page) {
            self.note(GpuError::Driver {
                call: "cuMemAddressReserve",
                message: format!(
                    "page {page} and size {size} are not multiples of the granularity {g}"
                ),
            });
            return Err(DeviceOom);
        }
        // Alignment 0: the driver's default, as PyTorch's expandable segments ask.
        match self.gpu.reserve(size, 0) {
            Ok(base) => {
                self.reservations.insert(
                    base,
                    Reservation {
                        size,
                        page,
                        pages: BTreeMap::new(),
                    },
                );
                Ok(base)
            }
            Err(e) => Err(self.failed(e, 0)),
        }
    }

    fn release(&mut self, addr: u64, size: u64) {
        let Some(r) = self.reservations.remove(&addr) else {
            self.note(GpuError::Driver {
                call: "cuMemAddressFree",
                message: format!("{addr:#x} is no reservation of this device"),
            });
            return;
        };
        if !r.pages.is_empty() {
            // The model releases only unmapped reservations; should it not, unmap first.
            if let Err(e) = self.gpu.synchronize() {
                self.note(e);
            }
            for (p, h) in r.pages {
                self.used_bytes -= r.page;
                if let Err(e) = self.gpu.unmap(p, r.page).and_then(|()| self.gpu.release(h)) {
                    self.note(e);
                }
            }
        }
        if let Err(e) = self.gpu.address_free(addr, size.max(r.size)) {
            self.note(e);
        }
    }

    fn map(&mut self, addr: u64, size: u64, _stream: u64) -> Result<(), DeviceOom> {
        let Some((base, page)) = self.reservation_of(addr) else {
            self.note(GpuError::Driver {
                call: "cuMemMap",
                message: format!("{addr:#x} lies in no reservation of this device"),
            });
            return Err(DeviceOom);
        };
        if !(addr - base).is_multiple_of(page) || !size.is_multiple_of(page) || size == 0 {
            self.note(GpuError::Driver {
                call: "cuMemMap",
                message: format!("[{addr:#x}, +{size}) is not whole pages of {page} bytes"),
            });
            return Err(DeviceOom);
        }
        if !self.cap_allows(size) {
            return Err(DeviceOom);
        }
        let pages: Vec<DevicePtr> = (0..size / page).map(|i| addr + i * page).collect();
        // Like PyTorch's ExpandableSegment::map: every page's physical memory first; if the
        // driver refuses one, the ones created so far are released and nothing is mapped.
        let mut created: Vec<(DevicePtr, PhysHandle, std::time::Duration)> =
            Vec::with_capacity(pages.len());
        for &p in &pages {
            let t = Instant::now();
            match self.gpu.create(page) {
                Ok(h) => created.push((p, h, t.elapsed())),
                Err(e) => {
                    // Counted before the release, so the free memory it records is
                    // what the driver refused with.
                    let oom = self.failed(e, page);
                    for (_, h, _) in created {
                        if let Err(e2) = self.gpu.release(h) {
                            self.note(e2);
                        }
                    }
                    return Err(oom);
                }
            }
        }
        let mut failed = false;
        for (p, h, create_time) in created {
            if failed {
                if let Err(e) = self.gpu.release(h) {
                    self.note(e);
                }
                continue;
            }
            let t = Instant::now();
            let r = self
                .gpu
                .map(p, page, h)
                .and_then(|()| self.gpu.set_access(p, page));
            self.latencies
                .record(CallKind::Map, create_time + t.elapsed());
            // Held from here on (also if mapping failed: release_all gives it back).
            if let Some(res) = self.reservations.get_mut(&base) {
                res.pages.insert(p, h);
            }
            self.used_bytes += page;
            if let Err(e) = r {
                self.note(e);
                failed = true;
            }
        }
        if failed { Err(DeviceOom) } else { Ok(()) }
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        let Some((base, page)) = self.reservation_of(addr) else {
            self.note(GpuError::Driver {
                call: "cuMemUnmap",
                message: format!("{addr:#x} lies in no reservation of this device"),
            });
            return;
        };
        // PyTorch synchronizes the device before unmapping (the pages may still be in use
        // by kernels in flight).
        if let Err(e) = self.gpu.synchronize() {
            self.note(e);
        }
        let end = addr + size;
        let handles: Vec<(DevicePtr, PhysHandle)> =
            self.reservations.get(&base).map_or_else(Vec::new, |r| {
                r.pages.range(addr..end).map(|(&p, &h)| (p, h)).collect()
            });
        if handles.len() as u64 * page != size {
            self.note(GpuError::Driver {
                call: "cuMemUnmap",
                message: format!("[{addr:#x}, +{size}) is not all mapped"),
            });
        }
        for (p, h) in handles {
            let t = Instant::now();
            let r = self.gpu.unmap(p, page).and_then(|()| self.gpu.release(h));
            self.latencies.record(CallKind::Unmap, t.elapsed());
            if let Some(res) = self.reservations.get_mut(&base) {
                res.pages.remove(&p);
            }
            self.used_bytes -= page;
            if let Err(e) = r {
                self.note(e);
            }
        }
    }

    fn free_bytes(&self) -> u64 {
        let real = self.gpu.mem_get_info().map_or(0, |(free, _)| free);
        match self.cap_bytes {
            Some(cap) => real.min(cap.saturating_sub(self.used_bytes)),
            None => real,
        }
    }
}
