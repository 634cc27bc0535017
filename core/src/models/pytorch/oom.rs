//! The OOM reports of the PyTorch model, as PyTorch words them: a request no device could
//! serve (above `MAX_REQUEST_BYTES`), a new segment refused by `throw_on_cudamalloc_oom`
//! (no `oom` entry, not counted in `num_ooms`), and the ordinary out-of-memory of the
//! ladder's end (an `oom` entry carrying the device's free bytes): §5.8.

use super::PyTorchModel;
use crate::device::Device;
use crate::models::{ModelEvent, OomInfo};
use crate::snapshot::Action;
use crate::units::format_size;

impl PyTorchModel {
    /// A request above [`MAX_REQUEST_BYTES`]: an `oom` entry of the request, as no
    /// device could have served it, without rounding it.
    #[cold]
    pub(super) fn too_large(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        stream: u64,
        out: &mut Vec<ModelEvent>,
    ) -> OomInfo {
        self.num_ooms += 1;
        out.push(ModelEvent {
            action: Action::Oom,
            addr: dev.free_bytes(),
            size,
            stream,
        });
        OomInfo {
            rounded_bytes: size,
            alloc_bytes: size,
            reserved_bytes: self.reserved_bytes,
            allocated_bytes: self.allocated_bytes,
            largest_free_bytes: 0,
            free_holes: 0,
            pool_free_bytes: 0,
            reason: crate::models::common::policy::too_large(size),
        }
    }

    /// A new segment refused by `throw_on_cudamalloc_oom`: the report, with the free
    /// blocks of the request's pool and stream.
    #[cold]
    pub(super) fn rejected_oom(
        &self,
        pool: u32,
        stream: u64,
        size: u64,
        alloc_size: u64,
    ) -> OomInfo {
        let reason = format!(
            "throw_on_cudamalloc_oom rejected a new {} segment: {} reserved would pass {} \
             (per_process_memory_fraction × total memory)",
            format_size(alloc_size),
            format_size(self.reserved_bytes + alloc_size),
            format_size(self.rejection_limit_bytes())
        );
        self.report(pool, stream, size, alloc_size, reason)
    }

    /// The end of the ladder: `num_ooms` counted, the `oom` entry (with the device's free
    /// bytes) and the report, with the free blocks of the request's pool and stream.
    #[cold]
    pub(super) fn out_of_memory(
        &mut self,
        dev: &mut dyn Device,
        pool: u32,
        stream: u64,
        size: u64,
        alloc_size: u64,
        out: &mut Vec<ModelEvent>,
    ) -> OomInfo {
        self.num_ooms += 1;
        let device_free = dev.free_bytes();
        out.push(ModelEvent {
            action: Action::Oom,
            addr: device_free,
            size,
            stream,
        });
        let reason = match self.limit_bytes {
            Some(l) if self.reserved_bytes + alloc_size > l => format!(
                "the capacity of {} would be exceeded by a new {} segment",
                format_size(l),
                format_size(alloc_size)
            ),
            _ => "the device refused a new segment".to_string(),
        };
        self.report(pool, stream, size, alloc_size, reason)
    }

    /// A report of a request rounded to `size` that needed a new segment of `alloc_size`:
    /// the totals, and the free blocks of its pool and stream.
    fn report(
        &self,
        pool: u32,
        stream: u64,
        size: u64,
        alloc_size: u64,
        reason: String,
    ) -> OomInfo {
        let (pool_free, holes, largest) = self.pool_stream_free(pool, stream);
        OomInfo {
            rounded_bytes: size,
            alloc_bytes: alloc_size,
            reserved_bytes: self.reserved_bytes,
            allocated_bytes: self.allocated_bytes,
            largest_free_bytes: largest,
            free_holes: holes,
            pool_free_bytes: pool_free,
            reason,
        }
    }
}
