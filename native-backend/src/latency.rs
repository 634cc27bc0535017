//! Latency of the driver calls a replay makes, per kind of call, as percentiles.

use std::collections::BTreeMap;
use std::time::Duration;

/// The kinds of driver call a replay times (the keys of `latency_us`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CallKind {
    /// `cuMemAlloc` of a segment (or of a request, in raw mode).
    Alloc,
    /// `cuMemFree`.
    Free,
    /// One page of an expandable segment: `cuMemCreate` + `cuMemMap` + `cuMemSetAccess`.
    Map,
    /// One page: `cuMemUnmap` + `cuMemRelease`.
    Unmap,
}

impl CallKind {
    /// The JSON key.
    #[must_use]
    pub fn key(self) -> &'static str {
        match self {
            CallKind::Alloc => "alloc",
            CallKind::Free => "free",
            CallKind::Map => "map",
            CallKind::Unmap => "unmap",
        }
    }

    /// Every kind, in key order.
    pub const ALL: [CallKind; 4] = [
        CallKind::Alloc,
        CallKind::Free,
        CallKind::Map,
        CallKind::Unmap,
    ];
}

/// Percentiles of one kind of call, in microseconds (nearest-rank; 0 when `count` is 0).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LatencyStats {
    pub count: u64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// Nearest-rank percentile `p` (0 < p ≤ 100) of sorted samples: the smallest sample with
/// at least p % of the samples at or below it.
#[must_use]
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Every timed call of a replay.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    samples: BTreeMap<CallKind, Vec<f64>>,
}

impl Latencies {
    /// Records one call of `kind` that took `d`.
    pub fn record(&mut self, kind: CallKind, d: Duration) {
        // Nanosecond resolution, kept as a short decimal so JSON round-trips it exactly.
        self.samples
            .entry(kind)
            .or_default()
            .push(d.as_nanos() as f64 / 1000.0);
    }

    /// Number of calls of `kind` recorded.
    #[must_use]
    pub fn count(&self, kind: CallKind) -> usize {
        self.samples.get(&kind).map_or(0, Vec::len)
    }

    /// The percentiles of every kind (all four keys, zero counts included).
    #[must_use]
    pub fn summary(&self) -> BTreeMap<&'static str, LatencyStats> {
        CallKind::ALL
            .iter()
            .map(|&k| {
                let mut v = self.samples.get(&k).cloned().unwrap_or_default();
                v.sort_by(f64::total_cmp);
                let stats = LatencyStats {
                    count: v.len() as u64,
                    p50: percentile(&v, 50.0),
                    p99: percentile(&v, 99.0),
                    max: v.last().copied().unwrap_or(0.0),
                };
                (k.key(), stats)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert!((percentile(&v, 50.0) - 50.0).abs() < 1e-12);
        assert!((percentile(&v, 99.0) - 99.0).abs() < 1e-12);
        assert!((percentile(&v, 100.0) - 100.0).abs() < 1e-12);
        assert!((percentile(&[7.0], 99.0) - 7.0).abs() < 1e-12);
        assert!(percentile(&[], 50.0).abs() < 1e-12);
        // Two samples: the median is the lower one (rank ceil(1.0) = 1).
        assert!((percentile(&[1.0, 9.0], 50.0) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn summary_has_every_kind() {
        let mut l = Latencies::default();
        l.record(CallKind::Map, Duration::from_micros(30));
        l.record(CallKind::Map, Duration::from_micros(10));
        let s = l.summary();
        assert_eq!(s.len(), 4);
        assert_eq!(s["map"].count, 2);
        assert!((s["map"].max - 30.0).abs() < 1e-6);
        assert!((s["map"].p50 - 10.0).abs() < 1e-6);
        assert_eq!(s["alloc"].count, 0);
    }
}
