//! Sizes (§4): `round_size` (a request to a block size, with `roundup_power2_divisions`)
//! and `get_allocation_size` (a block size to a new segment's size), and the bound
//! `throw_on_cudamalloc_oom` checks new segments against.

use super::{
    MIN_BLOCK_BYTES, MIN_LARGE_ALLOC_BYTES, PyTorchModel, ROUND_LARGE_BYTES, SMALL_BUFFER_BYTES,
    SMALL_SIZE_BYTES,
};

impl PyTorchModel {
    /// `round_size`: the block size a request of `size` bytes needs (§4.1).
    #[must_use]
    pub fn round_size(&self, size: u64) -> u64 {
        if size < MIN_BLOCK_BYTES {
            return MIN_BLOCK_BYTES;
        }
        let divisions = u64::from(self.divisions_for(size));
        if divisions > 1 && size > MIN_BLOCK_BYTES * divisions {
            return roundup_power2_next_division(size, divisions);
        }
        size.div_ceil(MIN_BLOCK_BYTES)
            .saturating_mul(MIN_BLOCK_BYTES)
    }

    pub(super) fn divisions_for(&self, size: u64) -> u32 {
        let log = 63 - u64::from(size.leading_zeros());
        let idx = log.saturating_sub(20).min(15) as usize;
        self.cfg.roundup_power2_divisions[idx]
    }

    /// `get_allocation_size`: the cudaMalloc size for a new segment (§4.3).
    #[must_use]
    pub fn allocation_size(&self, rounded: u64) -> u64 {
        if rounded <= SMALL_SIZE_BYTES {
            SMALL_BUFFER_BYTES
        } else if rounded < MIN_LARGE_ALLOC_BYTES {
            self.cfg.large_segment_size_bytes
        } else {
            rounded
                .div_ceil(ROUND_LARGE_BYTES)
                .saturating_mul(ROUND_LARGE_BYTES)
        }
    }

    /// The bound `throw_on_cudamalloc_oom` checks new segments against:
    /// `(size_t)(per_process_memory_fraction × totalGlobalMem)`.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    pub(super) fn rejection_limit_bytes(&self) -> u64 {
        (self.cfg.per_process_memory_fraction * self.cfg.device_total_bytes as f64) as u64
    }
}

/// `roundup_power2_next_division` (§4.1).
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor2 = 1u64 << size.ilog2();
    let step = floor2 >> divisions.ilog2();
    if step == 0 {
        return floor2.saturating_mul(2);
    }
    let r = size & !(step - 1);
    if r == size {
        size
    } else {
        r.saturating_add(step)
    }
}
