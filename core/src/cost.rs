//! What a replay's segment operations would cost in driver time: a table of measured
//! latencies (`cudaMalloc` and `cudaFree` by size; for expandable segments, per page:
//! `cuMemCreate` + `cuMemMap` + `cuMemSetAccess`, and `cuMemUnmap` + `cuMemRelease`),
//! interpolated between the measured sizes. Re-measure it on a GPU with
//! `allocsim cuda-cost-table` (native-backend's `cost::measure`) and paste the figures here.
//!
//! `cudaFree` synchronizes the whole device, and PyTorch synchronizes before unmapping
//! pages, so such operations are counted apart: they stall every stream, whatever their
//! latency.

use crate::models::ModelEvent;
use crate::snapshot::Action;

/// Measured latencies of one GPU and driver.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostTable {
    /// The GPU and driver the figures were measured on.
    pub measured_on: &'static str,
    /// `(bytes, µs)` of one `cuMemAlloc`, by increasing size.
    pub malloc_us: &'static [(u64, f64)],
    /// `(bytes, µs)` of one `cuMemFree` of an allocation of that size.
    pub free_us: &'static [(u64, f64)],
    /// `(page bytes, µs)` to create, map and enable access to one page.
    pub map_page_us: &'static [(u64, f64)],
    /// `(page bytes, µs)` to unmap and release one page.
    pub unmap_page_us: &'static [(u64, f64)],
}

/// Medians of 21 repetitions measured with `allocsim cuda-cost-table` (see the README for
/// the spread: the largest sizes vary most).
pub const H100_DRIVER_580: CostTable = CostTable {
    measured_on: "NVIDIA H100 80GB HBM3, driver 580.159.04, 2026-11-24",
    malloc_us: &[
        (2 << 20, 44.4),
        (20 << 20, 44.3),
        (256 << 20, 73.3),
        (1 << 30, 163.0),
        (4 << 30, 516.5),
    ],
    free_us: &[
        (2 << 20, 36.6),
        (20 << 20, 51.0),
        (256 << 20, 167.5),
        (1 << 30, 550.3),
        (4 << 30, 2349.8),
    ],
    map_page_us: &[(2 << 20, 31.4), (20 << 20, 29.5)],
    unmap_page_us: &[(2 << 20, 23.5), (20 << 20, 28.8)],
};

/// The table replays use.
pub const DEFAULT: &CostTable = &H100_DRIVER_580;

/// Piecewise-linear interpolation in `points` (sorted by size), extrapolated linearly
/// through the origin-free last segment above the largest size and held below the smallest.
fn interpolate(points: &[(u64, f64)], bytes: u64) -> f64 {
    let Some(&(first_b, first_us)) = points.first() else {
        return 0.0;
    };
    if bytes <= first_b {
        return first_us;
    }
    for w in points.windows(2) {
        let ((b0, t0), (b1, t1)) = (w[0], w[1]);
        if bytes <= b1 {
            return t0 + (t1 - t0) * (bytes - b0) as f64 / (b1 - b0) as f64;
        }
    }
    match points {
        [.., (b0, t0), (b1, t1)] => t1 + (t1 - t0) * (bytes - b1) as f64 / (b1 - b0) as f64,
        _ => first_us,
    }
}

/// The page a mapping of `bytes` was made of: PyTorch maps large-pool expandable segments
/// in 20 MiB pages and small-pool ones in 2 MiB pages.
fn page_of(bytes: u64) -> u64 {
    const LARGE_PAGE: u64 = 20 << 20;
    if bytes.is_multiple_of(LARGE_PAGE) {
        LARGE_PAGE
    } else {
        2 << 20
    }
}

/// The driver work of a replay: operations by kind and their predicted time.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct DriverCost {
    /// `cudaMalloc`s (new segments).
    pub mallocs: u64,
    /// `cudaFree`s (segments released); each synchronizes the device.
    pub frees: u64,
    /// Pages mapped into expandable segments.
    pub pages_mapped: u64,
    /// Pages unmapped from expandable segments.
    pub pages_unmapped: u64,
    /// Operations that synchronize the device: every `cudaFree` and every unmapping.
    pub synchronizing: u64,
    /// Predicted time of all of them, in microseconds.
    pub driver_time_us: f64,
}

impl DriverCost {
    /// Adds the segment events among `events` (a model's output for one request).
    #[inline]
    pub fn add(&mut self, table: &CostTable, events: &[ModelEvent]) {
        for e in events {
            match e.action {
                Action::SegmentAlloc => {
                    self.mallocs += 1;
                    self.driver_time_us += interpolate(table.malloc_us, e.size);
                }
                Action::SegmentFree => {
                    self.frees += 1;
                    self.synchronizing += 1;
                    self.driver_time_us += interpolate(table.free_us, e.size);
                }
                Action::SegmentMap => {
                    let page = page_of(e.size);
                    let pages = e.size.div_ceil(page);
                    self.pages_mapped += pages;
                    self.driver_time_us += pages as f64 * interpolate(table.map_page_us, page);
                }
                Action::SegmentUnmap => {
                    let page = page_of(e.size);
                    let pages = e.size.div_ceil(page);
                    self.pages_unmapped += pages;
                    self.synchronizing += 1;
                    self.driver_time_us += pages as f64 * interpolate(table.unmap_page_us, page);
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(action: Action, size: u64) -> ModelEvent {
        ModelEvent {
            action,
            addr: 0,
            size,
            stream: 0,
        }
    }

    const T: CostTable = CostTable {
        measured_on: "test",
        malloc_us: &[(2 << 20, 10.0), (4 << 20, 30.0)],
        free_us: &[(2 << 20, 100.0)],
        map_page_us: &[(2 << 20, 5.0), (20 << 20, 7.0)],
        unmap_page_us: &[(2 << 20, 3.0), (20 << 20, 4.0)],
    };

    #[test]
    fn latencies_interpolate_between_measured_sizes_and_extend_past_them() {
        assert!((interpolate(T.malloc_us, 1 << 20) - 10.0).abs() < 1e-9);
        assert!((interpolate(T.malloc_us, 3 << 20) - 20.0).abs() < 1e-9);
        assert!((interpolate(T.malloc_us, 6 << 20) - 50.0).abs() < 1e-9);
        assert!((interpolate(T.free_us, 1 << 30) - 100.0).abs() < 1e-9);
        assert!(interpolate(&[], 5).abs() < 1e-9);
    }

    #[test]
    fn segment_events_are_counted_and_timed_frees_and_unmaps_synchronize() {
        let mut c = DriverCost::default();
        c.add(
            &T,
            &[
                ev(Action::SegmentAlloc, 3 << 20),
                ev(Action::Alloc, 512),
                ev(Action::SegmentFree, 2 << 20),
                ev(Action::SegmentMap, 40 << 20),
                ev(Action::SegmentMap, 6 << 20),
                ev(Action::SegmentUnmap, 20 << 20),
            ],
        );
        assert_eq!((c.mallocs, c.frees), (1, 1));
        assert_eq!((c.pages_mapped, c.pages_unmapped), (5, 1));
        assert_eq!(c.synchronizing, 2);
        let want = 20.0 + 100.0 + 2.0 * 7.0 + 3.0 * 5.0 + 4.0;
        assert!(
            (c.driver_time_us - want).abs() < 1e-9,
            "{}",
            c.driver_time_us
        );
    }
}
