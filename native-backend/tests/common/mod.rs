//! Shared by the native-backend tests: a host-memory stand-in for a GPU (to test the
//! device layer, the replay driver and the runner without one) and small hand-built
//! traces.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use allocsim_core::snapshot::StackId;
use allocsim_core::trace::{DeviceTrace, Op, OpKind, PoolIx, Trace};
use allocsim_native::gpu::{DeviceInfo, DevicePtr, Gpu, GpuError, PhysHandle};

pub const MIB: u64 = 1 << 20;

/// The fake GPU's memory, shared with the test that inspects it afterwards.
#[derive(Debug, Default)]
pub struct FakeState {
    pub capacity_bytes: u64,
    pub granularity: u64,
    /// Bytes taken (allocations rounded up to the granularity, physical handles).
    pub used_bytes: u64,
    pub next_addr: u64,
    /// `cuMemAlloc`s: address → size.
    pub allocs: BTreeMap<u64, u64>,
    /// Reservations: base → size.
    pub reservations: BTreeMap<u64, u64>,
    /// Physical handles: id → (size, released, mapped).
    pub handles: BTreeMap<u64, (u64, bool, bool)>,
    /// Mapped ranges: address → (size, handle).
    pub mapped: BTreeMap<u64, (u64, u64)>,
    next_handle: u64,
    /// Every fill, oldest first: (start, len, word).
    fills: Vec<(u64, u64, u32)>,
    /// Hand every allocation out at the same address (a broken driver: live blocks
    /// overlap), to prove the data check notices.
    pub overlap_bug: bool,
    /// Memory the driver keeps for itself: reported free, never handed out. One 2 MiB page
    /// by default, as an H200's driver does (an H100's keeps two; replays behind a
    /// balloon measure it with `CudaDevice::probe_usable_bytes`).
    pub headroom_bytes: u64,
    /// Panic in the n-th driver call from now (once).
    pub panic_in_calls: Option<u64>,
    /// Fail the n-th driver call from now with a driver error (once).
    pub fail_in_calls: Option<u64>,
    pub calls: u64,
}

impl FakeState {
    /// Nothing held any more.
    pub fn is_empty(&self) -> bool {
        self.used_bytes == 0
            && self.allocs.is_empty()
            && self.reservations.is_empty()
            && self.handles.is_empty()
            && self.mapped.is_empty()
    }
}

/// A GPU made of bookkeeping: refuses beyond its capacity at 2 MiB granularity like the
/// driver, keeps what was written so reads see it.
#[derive(Debug, Clone)]
pub struct FakeGpu {
    pub state: Arc<Mutex<FakeState>>,
    info: DeviceInfo,
}

impl FakeGpu {
    pub fn new(capacity_bytes: u64) -> FakeGpu {
        let state = FakeState {
            capacity_bytes,
            granularity: 2 * MIB,
            headroom_bytes: 2 * MIB,
            next_addr: 0x7f00_0000_0000,
            ..FakeState::default()
        };
        FakeGpu {
            state: Arc::new(Mutex::new(state)),
            info: DeviceInfo {
                ordinal: 0,
                name: "Fake GPU".into(),
                total_bytes: capacity_bytes,
                free_bytes_at_start: capacity_bytes,
            },
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts a call; injects the planned failure or panic.
    fn call(&self, name: &'static str) -> Result<(), GpuError> {
        let panic_now;
        {
            let mut s = self.lock();
            s.calls += 1;
            panic_now = match s.panic_in_calls {
                Some(1) => {
                    s.panic_in_calls = None;
                    true
                }
                Some(n) => {
                    s.panic_in_calls = Some(n - 1);
                    false
                }
                None => false,
            };
            match s.fail_in_calls {
                Some(1) => {
                    s.fail_in_calls = None;
                    return Err(GpuError::Driver {
                        call: name,
                        message: "injected failure".into(),
                    });
                }
                Some(n) => s.fail_in_calls = Some(n - 1),
                None => {}
            }
        }
        assert!(!panic_now, "injected panic in {name}");
        Ok(())
    }

    fn take(&self, bytes: u64, call: &'static str) -> Result<u64, GpuError> {
        let mut s = self.lock();
        let rounded = bytes.div_ceil(s.granularity) * s.granularity;
        if s.used_bytes + rounded + s.headroom_bytes > s.capacity_bytes {
            return Err(GpuError::OutOfMemory { call });
        }
        s.used_bytes += rounded;
        Ok(rounded)
    }
}

impl Gpu for FakeGpu {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_get_info(&self) -> Result<(u64, u64), GpuError> {
        let s = self.lock();
        Ok((s.capacity_bytes - s.used_bytes, s.capacity_bytes))
    }

    fn granularity(&self) -> u64 {
        self.lock().granularity
    }

    fn alloc(&mut self, bytes: u64) -> Result<DevicePtr, GpuError> {
        self.call("cuMemAlloc")?;
        let rounded = self.take(bytes, "cuMemAlloc")?;
        let mut s = self.lock();
        let addr = if s.overlap_bug {
            0x7f00_0000_0000 + s.allocs.len() as u64 * 512
        } else {
            s.next_addr
        };
        s.next_addr += rounded;
        s.allocs.insert(addr, bytes);
        Ok(addr)
    }

    fn free(&mut self, ptr: DevicePtr) -> Result<(), GpuError> {
        self.call("cuMemFree")?;
        let mut s = self.lock();
        let Some(size) = s.allocs.remove(&ptr) else {
            return Err(GpuError::Driver {
                call: "cuMemFree",
                message: format!("{ptr:#x} was not allocated"),
            });
        };
        let g = s.granularity;
        s.used_bytes -= size.div_ceil(g) * g;
        Ok(())
    }

    fn reserve(&mut self, bytes: u64, _alignment: u64) -> Result<DevicePtr, GpuError> {
        self.call("cuMemAddressReserve")?;
        let mut s = self.lock();
        let base = s.next_addr + (1 << 40);
        s.next_addr = base + bytes + (1 << 30);
        s.reservations.insert(base, bytes);
        Ok(base)
    }

    fn address_free(&mut self, ptr: DevicePtr, bytes: u64) -> Result<(), GpuError> {
        self.call("cuMemAddressFree")?;
        let mut s = self.lock();
        if s.mapped.range(ptr..ptr + bytes).next().is_some() {
            return Err(GpuError::Driver {
                call: "cuMemAddressFree",
                message: "pages still mapped".into(),
            });
        }
        match s.reservations.remove(&ptr) {
            Some(b) if b == bytes => Ok(()),
            _ => Err(GpuError::Driver {
                call: "cuMemAddressFree",
                message: format!("no reservation {ptr:#x} of {bytes} bytes"),
            }),
        }
    }

    fn create(&mut self, bytes: u64) -> Result<PhysHandle, GpuError> {
        self.call("cuMemCreate")?;
        let rounded = self.take(bytes, "cuMemCreate")?;
        let mut s = self.lock();
        s.next_handle += 1;
        let h = s.next_handle;
        s.handles.insert(h, (rounded, false, false));
        Ok(PhysHandle(h))
    }

    fn release(&mut self, handle: PhysHandle) -> Result<(), GpuError> {
        self.call("cuMemRelease")?;
        let mut s = self.lock();
        let Some(&(size, released, mapped)) = s.handles.get(&handle.0) else {
            return Err(GpuError::Driver {
                call: "cuMemRelease",
                message: "unknown handle".into(),
            });
        };
        if released {
            return Err(GpuError::Driver {
                call: "cuMemRelease",
                message: "released twice".into(),
            });
        }
        if mapped {
            s.handles.insert(handle.0, (size, true, true));
        } else {
            s.handles.remove(&handle.0);
            s.used_bytes -= size;
        }
        Ok(())
    }

    fn map(&mut self, ptr: DevicePtr, bytes: u64, handle: PhysHandle) -> Result<(), GpuError> {
        self.call("cuMemMap")?;
        let mut s = self.lock();
        let inside = s
            .reservations
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&b, &l)| ptr + bytes <= b + l);
        let free = s
            .mapped
            .range(..ptr + bytes)
            .next_back()
            .is_none_or(|(&a, &(l, _))| a + l <= ptr);
        match s.handles.get(&handle.0).copied() {
            Some((size, false, false)) if size == bytes && inside && free => {
                s.handles.insert(handle.0, (size, false, true));
                s.mapped.insert(ptr, (bytes, handle.0));
                Ok(())
            }
            _ => Err(GpuError::Driver {
                call: "cuMemMap",
                message: format!("cannot map {bytes} bytes at {ptr:#x}"),
            }),
        }
    }

    fn set_access(&mut self, ptr: DevicePtr, _bytes: u64) -> Result<(), GpuError> {
        self.call("cuMemSetAccess")?;
        if self.lock().mapped.contains_key(&ptr) {
            Ok(())
        } else {
            Err(GpuError::Driver {
                call: "cuMemSetAccess",
                message: "not mapped".into(),
            })
        }
    }

    fn unmap(&mut self, ptr: DevicePtr, bytes: u64) -> Result<(), GpuError> {
        self.call("cuMemUnmap")?;
        let mut s = self.lock();
        let Some((size, h)) = s.mapped.remove(&ptr) else {
            return Err(GpuError::Driver {
                call: "cuMemUnmap",
                message: format!("{ptr:#x} not mapped"),
            });
        };
        if size != bytes {
            return Err(GpuError::Driver {
                call: "cuMemUnmap",
                message: "size mismatch".into(),
            });
        }
        if let Some(&(hsize, released, _)) = s.handles.get(&h) {
            if released {
                s.handles.remove(&h);
                s.used_bytes -= hsize;
            } else {
                s.handles.insert(h, (hsize, false, false));
            }
        }
        Ok(())
    }

    fn synchronize(&mut self) -> Result<(), GpuError> {
        self.call("cuCtxSynchronize")
    }

    fn fill(&mut self, ptr: DevicePtr, bytes: u64, word: u32) -> Result<(), GpuError> {
        self.call("cuMemsetD32")?;
        self.lock().fills.push((ptr, bytes, word));
        Ok(())
    }

    fn read(&mut self, ptr: DevicePtr, out: &mut [u8]) -> Result<(), GpuError> {
        self.call("cuMemcpyDtoH")?;
        let s = self.lock();
        for (i, b) in out.iter_mut().enumerate() {
            let a = ptr + i as u64;
            *b = s
                .fills
                .iter()
                .rev()
                .find(|&&(p, l, _)| a >= p && a < p + l)
                .map_or(0, |&(p, _, w)| w.to_le_bytes()[((a - p) % 4) as usize]);
        }
        Ok(())
    }
}

/// A builder of small traces: requests by hand, event indexes in order.
#[derive(Debug, Default)]
pub struct TraceBuilder {
    ops: Vec<Op>,
}

impl TraceBuilder {
    fn push(&mut self, kind: OpKind) -> u32 {
        let k = self.ops.len() as u32;
        self.ops.push(Op {
            kind,
            event_index: k,
            recorded_addr: 0,
            stack: StackId::EMPTY,
            time_us: i64::from(k),
        });
        k
    }

    /// An alloc on stream 0 of the default pool; returns its op index.
    pub fn alloc(&mut self, size_bytes: u64) -> u32 {
        self.push(OpKind::Alloc {
            size_bytes,
            stream: 0,
            pool: PoolIx::DEFAULT,
            recorded_oom: false,
            restored: false,
        })
    }

    pub fn free(&mut self, alloc: u32) {
        self.push(OpKind::Free {
            alloc,
            deferred: false,
        });
    }

    pub fn free_deferred(&mut self, alloc: u32) {
        self.push(OpKind::Free {
            alloc,
            deferred: true,
        });
    }

    pub fn complete(&mut self, alloc: u32) {
        self.push(OpKind::CompleteFree { alloc });
    }

    pub fn empty_cache(&mut self) {
        self.push(OpKind::EmptyCache);
    }

    pub fn build(self) -> Trace {
        let events = self.ops.len();
        Trace {
            snapshot: allocsim_core::trace::SnapshotInfo::default(),
            devices: vec![DeviceTrace {
                device: 0,
                ops: self.ops,
                events,
                ..DeviceTrace::default()
            }],
        }
    }
}

/// A small training-like trace: segments of both pools made, split, reused, released by
/// `empty_cache`, deferred frees.
#[allow(clippy::many_single_char_names)]
pub fn small_training_trace() -> Trace {
    let mut t = TraceBuilder::default();
    for step in 0..3u64 {
        let w = t.alloc(30 * MIB + step * 4096);
        let s1 = t.alloc(512 * 1024);
        let s2 = t.alloc(100 * 1024 + step);
        let a = t.alloc(8 * MIB);
        let b = t.alloc(25 * MIB);
        t.free(w);
        let c = t.alloc(12 * MIB);
        t.free_deferred(s1);
        t.free(a);
        t.complete(s1);
        t.free(b);
        t.free(c);
        t.free(s2);
        if step == 1 {
            t.empty_cache();
        }
    }
    let big = t.alloc(300 * MIB);
    t.free(big);
    t.empty_cache();
    t.build()
}

/// 30 MiB allocations that are never freed: an OOM once `n` of them do not fit.
pub fn growing_trace(n: usize) -> Trace {
    let mut t = TraceBuilder::default();
    for _ in 0..n {
        t.alloc(30 * MIB);
    }
    t.build()
}
