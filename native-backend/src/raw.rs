//! Raw mode's "allocator": no allocator at all. Every request goes to the device as it is
//! (`cuMemAlloc(size)` on the CUDA device), every free straight back (`cuMemFree`), so the
//! real driver's own behaviour — its page granularity, how it packs small requests — is
//! what a replay measures, to calibrate the `cuda-malloc` model and the simulated device.
//!
//! A request of 0 bytes reaches no driver (`cudaMalloc(0)` allocates nothing): it gets a
//! unique address from a range no GPU hands out, and its free is a no-op.

use std::collections::BTreeMap;

use allocsim_core::device::Device;
use allocsim_core::models::{
    AllocRequest, Allocator, Layout, LayoutBlock, LayoutBlockState, LayoutSegment, ModelError,
    ModelEvent, ModelStats, OomInfo, PoolId,
};
use allocsim_core::snapshot::Action;

/// Addresses of 0-byte requests: above any canonical device virtual address.
const ZERO_SIZE_BASE: u64 = 1 << 62;

/// One live request.
#[derive(Debug, Clone, Copy)]
struct Live {
    size: u64,
    stream: u64,
    pool: PoolId,
    /// `free(deferred)` was called; the memory goes back at the completion.
    pending: bool,
}

/// Every request straight to the device (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct RawPassthrough {
    /// Live requests by address. Invariant: `held_bytes` is the sum of their sizes.
    live: BTreeMap<u64, Live>,
    held_bytes: u64,
    zero_size_next: u64,
    segment_ops: u64,
}

impl RawPassthrough {
    /// Nothing allocated yet.
    #[must_use]
    pub fn new() -> RawPassthrough {
        RawPassthrough::default()
    }

    fn give_back(&mut self, dev: &mut dyn Device, addr: u64, out: &mut Vec<ModelEvent>) {
        if let Some(l) = self.live.remove(&addr) {
            self.held_bytes -= l.size;
            if addr < ZERO_SIZE_BASE {
                dev.free(addr, l.size);
                self.segment_ops += 1;
                out.push(ModelEvent {
                    action: Action::SegmentFree,
                    addr,
                    size: l.size,
                    stream: l.stream,
                });
            }
        }
    }
}

impl Allocator for RawPassthrough {
    fn name(&self) -> &'static str {
        "raw"
    }

    fn config_string(&self) -> String {
        String::new()
    }

    fn malloc(
        &mut self,
        dev: &mut dyn Device,
        req: &AllocRequest,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u64, OomInfo> {
        let addr = if req.size_bytes == 0 {
            self.zero_size_next += 1;
            ZERO_SIZE_BASE + self.zero_size_next
        } else if let Ok(a) = dev.malloc(req.size_bytes, req.stream) {
            self.segment_ops += 1;
            out.push(ModelEvent {
                action: Action::SegmentAlloc,
                addr: a,
                size: req.size_bytes,
                stream: req.stream,
            });
            a
        } else {
            out.push(ModelEvent {
                action: Action::Oom,
                addr: dev.free_bytes(),
                size: req.size_bytes,
                stream: req.stream,
            });
            return Err(OomInfo {
                rounded_bytes: req.size_bytes,
                alloc_bytes: req.size_bytes,
                reserved_bytes: self.held_bytes,
                allocated_bytes: self.held_bytes,
                largest_free_bytes: 0,
                free_holes: 0,
                pool_free_bytes: 0,
                reason: "the driver refused cuMemAlloc".to_string(),
            });
        };
        self.live.insert(
            addr,
            Live {
                size: req.size_bytes,
                stream: req.stream,
                pool: req.pool,
                pending: false,
            },
        );
        self.held_bytes += req.size_bytes;
        out.push(ModelEvent {
            action: Action::Alloc,
            addr,
            size: req.size_bytes,
            stream: req.stream,
        });
        Ok(addr)
    }

    fn free(
        &mut self,
        dev: &mut dyn Device,
        addr: u64,
        deferred: bool,
        out: &mut Vec<ModelEvent>,
    ) -> Result<(), ModelError> {
        let Some(l) = self.live.get_mut(&addr) else {
            return Err(ModelError::UnknownAddress(addr));
        };
        if l.pending {
            return Err(ModelError::UnknownAddress(addr));
        }
        if deferred {
            l.pending = true;
            return Ok(());
        }
        self.give_back(dev, addr, out);
        Ok(())
    }

    fn complete_free(
        &mut self,
        dev: &mut dyn Device,
        addr: u64,
        out: &mut Vec<ModelEvent>,
    ) -> Result<(), ModelError> {
        match self.live.get(&addr) {
            Some(l) if l.pending => {
                self.give_back(dev, addr, out);
                Ok(())
            }
            _ => Err(ModelError::NotPending(addr)),
        }
    }

    fn empty_cache(&mut self, _dev: &mut dyn Device, _out: &mut Vec<ModelEvent>) {}

    fn stats(&self) -> ModelStats {
        ModelStats {
            reserved_bytes: self.held_bytes,
            allocated_bytes: self.held_bytes,
            requested_bytes: self.held_bytes,
            largest_free_bytes: 0,
            free_holes: 0,
            segment_ops: self.segment_ops,
        }
    }

    fn layout(&self) -> Layout {
        let mut segments: Vec<LayoutSegment> = self
            .live
            .iter()
            .map(|(&addr, l)| LayoutSegment {
                addr,
                size_bytes: l.size,
                stream: l.stream,
                pool: l.pool,
                small: false,
                expandable: false,
                blocks: vec![LayoutBlock {
                    addr,
                    size_bytes: l.size,
                    requested_bytes: l.size,
                    state: if l.pending {
                        LayoutBlockState::PendingFree
                    } else {
                        LayoutBlockState::Allocated
                    },
                }],
            })
            .collect();
        segments.sort_by_key(|s| (s.pool, s.stream, s.addr));
        Layout { segments }
    }

    fn check_invariants(&self) -> Result<(), String> {
        let sum: u64 = self.live.values().map(|l| l.size).sum();
        if sum != self.held_bytes {
            return Err(format!(
                "held bytes {} but live requests sum to {sum}",
                self.held_bytes
            ));
        }
        let mut end = 0u64;
        for (&a, l) in &self.live {
            if a < end {
                return Err(format!("live requests overlap at {a:#x}"));
            }
            end = a + l.size;
        }
        Ok(())
    }

    fn clone_box(&self) -> Box<dyn Allocator> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allocsim_core::device::SimulatedDevice;

    #[test]
    fn every_request_is_one_device_malloc_and_deferred_frees_wait() {
        let mut dev = SimulatedDevice::new(1 << 30, None);
        let mut m = RawPassthrough::new();
        let mut out = Vec::new();
        let req = |size_bytes| AllocRequest {
            size_bytes,
            stream: 0,
            pool: PoolId::DEFAULT,
        };
        let a = m.malloc(&mut dev, &req(1000), &mut out).unwrap();
        let b = m.malloc(&mut dev, &req(3 << 20), &mut out).unwrap();
        let z = m.malloc(&mut dev, &req(0), &mut out).unwrap();
        assert_eq!(
            out.iter()
                .filter(|e| e.action == Action::SegmentAlloc)
                .count(),
            2
        );
        assert_eq!(m.stats().reserved_bytes, 1000 + (3 << 20));
        // The simulated device counts 2 MiB pages per cudaMalloc: 2 + 4 MiB.
        assert_eq!(dev.free_bytes(), (1 << 30) - (6 << 20));
        m.free(&mut dev, b, true, &mut out).unwrap();
        assert_eq!(
            m.stats().reserved_bytes,
            1000 + (3 << 20),
            "a deferred free holds the memory"
        );
        m.complete_free(&mut dev, b, &mut out).unwrap();
        m.free(&mut dev, a, false, &mut out).unwrap();
        m.free(&mut dev, z, false, &mut out).unwrap();
        assert_eq!(m.stats().reserved_bytes, 0);
        assert_eq!(dev.free_bytes(), 1 << 30);
        assert_eq!(
            m.free(&mut dev, a, false, &mut out),
            Err(ModelError::UnknownAddress(a))
        );
        m.check_invariants().unwrap();
    }

    #[test]
    fn a_refused_request_is_an_oom_and_holds_nothing() {
        let mut dev = SimulatedDevice::new(4 << 20, None);
        let mut m = RawPassthrough::new();
        let mut out = Vec::new();
        let e = m
            .malloc(
                &mut dev,
                &AllocRequest {
                    size_bytes: 5 << 20,
                    stream: 0,
                    pool: PoolId::DEFAULT,
                },
                &mut out,
            )
            .unwrap_err();
        assert_eq!(e.rounded_bytes, 5 << 20);
        assert_eq!(m.stats().reserved_bytes, 0);
        assert_eq!(out.last().map(|e| e.action), Some(Action::Oom));
    }
}
