//! Rounding and the device's page: what every model's sizes go through.

/// The physical page of CUDA memory: `cudaMalloc(n)` holds `n` rounded up to 2 MiB
/// (peers.md §B.5, §B.6), and the simulated device counts memory in these pages.
pub const PAGE_BYTES: u64 = 2 << 20;

/// `n` rounded up to a multiple of `align` (a power of two or any positive step).
#[must_use]
pub fn round_up(n: u64, align: u64) -> u64 {
    n.div_ceil(align).saturating_mul(align)
}

/// `n` rounded down to a multiple of `align`.
#[must_use]
pub fn round_down(n: u64, align: u64) -> u64 {
    n / align * align
}

/// Device memory a `cudaMalloc(size)` holds: whole 2 MiB pages.
#[must_use]
pub fn device_bytes(size: u64) -> u64 {
    round_up(size, PAGE_BYTES)
}
