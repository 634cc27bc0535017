//! Min/max envelopes of a metric column, for drawing a million samples in a few thousand
//! pixels: the column plus coarser levels of (min, max) per 16, 256, 4096, … samples, so
//! the range of any span of samples is found in O(16 · levels). The levels are kept apart
//! from the samples ([`Levels`]), so a replay's envelopes read its timeline's compact
//! columns where they are ([`Samples`]) instead of a copy of them as `f32`.

use allocsim_core::metrics::{self, Column, Timeline};
use allocsim_core::models::ModelStats;

/// Samples per bucket grow by this factor per level.
const FANOUT: usize = 16;

/// Where an envelope's samples are read, each as `f32`.
#[derive(Debug, Clone, Copy)]
pub enum Samples<'a> {
    /// Plain values.
    Floats(&'a [f32]),
    /// A column of a replay's timeline (bytes, exact; drawn as `f32`).
    Column(&'a Column),
    /// Core's fragmentation (0..=1) of each sample of a replay's timeline, from its
    /// reserved, allocated and largest free bytes.
    Fragmentation(&'a Timeline),
}

impl Samples<'_> {
    /// Number of samples.
    #[must_use]
    pub fn len(&self) -> usize {
        match self {
            Samples::Floats(v) => v.len(),
            Samples::Column(c) => c.len(),
            Samples::Fragmentation(t) => t.len(),
        }
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sample `i`.
    #[must_use]
    pub fn get(&self, i: usize) -> Option<f32> {
        match self {
            Samples::Floats(v) => v.get(i).copied(),
            Samples::Column(c) => c.get(i).map(|b| b as f32),
            Samples::Fragmentation(t) => Some(fragmentation(
                t.reserved_bytes.get(i)?,
                t.allocated_bytes.get(i)?,
                t.largest_free_bytes.get(i)?,
            )),
        }
    }
}

/// Core's fragmentation of one sample, as drawn.
fn fragmentation(reserved: u64, allocated: u64, largest_free: u64) -> f32 {
    metrics::fragmentation(&ModelStats {
        reserved_bytes: reserved,
        allocated_bytes: allocated,
        largest_free_bytes: largest_free,
        ..ModelStats::default()
    }) as f32
}

/// The min/max levels of a column of samples held elsewhere: `levels[l][i]` is the
/// (min, max) of samples `i·16^(l+1) .. (i+1)·16^(l+1)` (about half a byte a sample in
/// all).
#[derive(Debug, Clone, Default)]
pub struct Levels {
    levels: Vec<Vec<(f32, f32)>>,
}

impl Levels {
    /// The levels of `samples`, read once in order.
    #[must_use]
    pub fn new(samples: Samples<'_>) -> Levels {
        match samples {
            Samples::Floats(v) => Levels::of(v.iter().copied(), v.len()),
            Samples::Column(c) => Levels::of_column(c),
            Samples::Fragmentation(t) => Levels::of_fragmentation(t),
        }
    }

    /// The levels of a column, read a chunk of 64 samples at a time (the first level's
    /// buckets of 16 lie within chunks); a bucket's bounds taken in `u64` and made `f32`
    /// once, which is the same as of its samples made `f32` (the conversion keeps order).
    fn of_column(c: &Column) -> Levels {
        let mut first = Vec::with_capacity(c.len().div_ceil(FANOUT));
        let mut buf = [0u64; metrics::BLOCK];
        for b in 0..c.chunk_count() {
            for g in c.read_chunk(b, &mut buf).chunks(FANOUT) {
                let (lo, hi) = g
                    .iter()
                    .fold((u64::MAX, 0), |(lo, hi), &v| (lo.min(v), hi.max(v)));
                first.push((lo as f32, hi as f32));
            }
        }
        Levels::above(first)
    }

    /// The levels of core's fragmentation of each sample of `t`, its three columns read a
    /// chunk at a time together (they have one length, so their chunks match).
    fn of_fragmentation(t: &Timeline) -> Levels {
        let mut first = Vec::with_capacity(t.len().div_ceil(FANOUT));
        let mut bufs = [[0u64; metrics::BLOCK]; 3];
        let [r, a, l] = &mut bufs;
        for b in 0..t.reserved_bytes.chunk_count() {
            let r = t.reserved_bytes.read_chunk(b, r);
            let a = t.allocated_bytes.read_chunk(b, a);
            let l = t.largest_free_bytes.read_chunk(b, l);
            for ((r, a), l) in r.chunks(FANOUT).zip(a.chunks(FANOUT)).zip(l.chunks(FANOUT)) {
                let acc = r
                    .iter()
                    .zip(a)
                    .zip(l)
                    .map(|((&r, &a), &l)| fragmentation(r, a, l))
                    .fold((f32::INFINITY, f32::NEG_INFINITY), |acc, v| {
                        (acc.0.min(v), acc.1.max(v))
                    });
                first.push(acc);
            }
        }
        Levels::above(first)
    }

    /// The levels of `n` samples.
    fn of(samples: impl Iterator<Item = f32>, n: usize) -> Levels {
        let mut first = Vec::with_capacity(n.div_ceil(FANOUT));
        let mut acc = (f32::INFINITY, f32::NEG_INFINITY);
        let mut k = 0;
        for v in samples {
            acc = (acc.0.min(v), acc.1.max(v));
            k += 1;
            if k == FANOUT {
                first.push(acc);
                (acc, k) = ((f32::INFINITY, f32::NEG_INFINITY), 0);
            }
        }
        if k > 0 {
            first.push(acc);
        }
        Levels::above(first)
    }

    /// The levels over a first level.
    fn above(first: Vec<(f32, f32)>) -> Levels {
        let mut levels: Vec<Vec<(f32, f32)>> = Vec::new();
        let mut prev = first;
        while !prev.is_empty() {
            let next: Vec<(f32, f32)> = if prev.len() > 1 {
                prev.chunks(FANOUT).map(merge).collect()
            } else {
                Vec::new()
            };
            levels.push(prev);
            prev = next;
        }
        Levels { levels }
    }

    /// The heap bytes of the levels.
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        self.levels
            .iter()
            .map(|l| l.capacity() * std::mem::size_of::<(f32, f32)>())
            .sum()
    }

    /// The levels over their samples: what is drawn.
    #[must_use]
    pub fn over<'a>(&'a self, samples: Samples<'a>) -> Curve<'a> {
        Curve {
            samples,
            levels: self,
        }
    }
}

/// A column of samples and its levels, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct Curve<'a> {
    samples: Samples<'a>,
    levels: &'a Levels,
}

impl Curve<'_> {
    /// Number of samples.
    #[must_use]
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Sample `i`.
    #[must_use]
    pub fn get(&self, i: usize) -> Option<f32> {
        self.samples.get(i)
    }

    /// (min, max) over samples `lo..hi` (`None` if empty).
    #[must_use]
    pub fn range(&self, lo: usize, hi: usize) -> Option<(f32, f32)> {
        let hi = hi.min(self.len());
        if lo >= hi {
            return None;
        }
        let levels = &self.levels.levels;
        let mut acc = (f32::INFINITY, f32::NEG_INFINITY);
        let mut i = lo;
        while i < hi {
            // The coarsest aligned bucket that starts at i and fits.
            let mut size = 1usize;
            let mut level = None;
            for (l, lv) in levels.iter().enumerate() {
                let s = size * FANOUT;
                if i.is_multiple_of(s) && i + s <= hi && i / s < lv.len() {
                    size = s;
                    level = Some(l);
                } else {
                    break;
                }
            }
            if let Some(l) = level {
                acc = merge(&[acc, levels[l][i / size]]);
            } else if let Some(v) = self.samples.get(i) {
                acc = (acc.0.min(v), acc.1.max(v));
            }
            i += size;
        }
        Some(acc)
    }
}

/// A column of plain `f32` samples and its levels, owned.
#[derive(Debug, Clone, Default)]
pub struct Envelope {
    base: Vec<f32>,
    levels: Levels,
}

impl Envelope {
    /// Builds the levels of `values`.
    #[must_use]
    pub fn new(values: Vec<f32>) -> Envelope {
        Envelope {
            levels: Levels::new(Samples::Floats(&values)),
            base: values,
        }
    }

    /// The heap bytes of the samples and their levels.
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        4 * self.base.capacity() + self.levels.heap_bytes()
    }

    /// The samples and their levels, as drawn.
    #[must_use]
    pub fn curve(&self) -> Curve<'_> {
        self.levels.over(Samples::Floats(&self.base))
    }

    /// Number of samples.
    #[must_use]
    pub fn len(&self) -> usize {
        self.base.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.base.is_empty()
    }

    /// Sample `i`.
    #[must_use]
    pub fn get(&self, i: usize) -> Option<f32> {
        self.base.get(i).copied()
    }

    /// (min, max) over samples `lo..hi` (`None` if empty).
    #[must_use]
    pub fn range(&self, lo: usize, hi: usize) -> Option<(f32, f32)> {
        self.curve().range(lo, hi)
    }
}

/// A column of exact bytes and its levels, owned: what a file records, drawn as `f32`
/// (as [`Samples::Column`] reads it) without a copy of it as `f32` (on the 1.12 GB
/// snapshot 116 MiB of the page's memory for its 14.5 M entries).
#[derive(Debug, Clone, Default)]
pub struct ColumnEnvelope {
    column: Column,
    levels: Levels,
}

impl ColumnEnvelope {
    /// Builds the levels of `column`.
    #[must_use]
    pub fn new(column: Column) -> ColumnEnvelope {
        ColumnEnvelope {
            levels: Levels::new(Samples::Column(&column)),
            column,
        }
    }

    /// The samples and their levels, as drawn.
    #[must_use]
    pub fn curve(&self) -> Curve<'_> {
        self.levels.over(Samples::Column(&self.column))
    }

    /// Number of samples.
    #[must_use]
    pub fn len(&self) -> usize {
        self.column.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.column.is_empty()
    }

    /// Sample `i`, exact.
    #[must_use]
    pub fn bytes(&self, i: usize) -> Option<u64> {
        self.column.get(i)
    }

    /// Sample `i`, as drawn.
    #[must_use]
    pub fn get(&self, i: usize) -> Option<f32> {
        self.bytes(i).map(|b| b as f32)
    }
}

#[cfg(test)]
fn min_max(v: &[f32]) -> (f32, f32) {
    v.iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        })
}

fn merge(v: &[(f32, f32)]) -> (f32, f32) {
    v.iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &(x, y)| {
            (a.min(x), b.max(y))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_match_a_plain_scan() {
        let values: Vec<f32> = (0..10_000u32).map(|i| ((i * 7919) % 1013) as f32).collect();
        let e = Envelope::new(values.clone());
        for &(lo, hi) in &[
            (0, 10_000),
            (3, 4),
            (15, 17),
            (16, 32),
            (100, 9_000),
            (4095, 4097),
            (9_990, 10_000),
            (0, 1),
        ] {
            let want = min_max(&values[lo..hi]);
            assert_eq!(e.range(lo, hi), Some(want), "{lo}..{hi}");
        }
        assert_eq!(e.range(5, 5), None);
        assert_eq!(e.range(9_999, 20_000), Some((values[9_999], values[9_999])));
    }
}

#[cfg(test)]
mod column_tests {
    use super::*;

    /// A replay's curves read from its compact columns draw exactly what envelopes of
    /// plain `f32` copies of them drew: every sample and the range of every span.
    #[test]
    fn curves_over_a_timelines_columns_equal_envelopes_of_float_copies() {
        let mut t = Timeline::default();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..5_000u64 {
            // Steps of segments, allocations moving within them, some runs constant.
            let reserved = (1 + i / 700) << 31;
            let allocated = if i % 900 < 100 {
                1 << 30
            } else {
                next() % reserved
            };
            t.push(&ModelStats {
                reserved_bytes: reserved,
                allocated_bytes: allocated,
                largest_free_bytes: next() % (reserved - allocated + 1),
                ..ModelStats::default()
            });
        }
        let floats = |c: &Column| c.iter().map(|b| b as f32).collect::<Vec<f32>>();
        let frag: Vec<f32> = (0..t.len())
            .map(|i| metrics::fragmentation(&t.stats_at(i)) as f32)
            .collect();
        let cases = [
            (
                Samples::Column(&t.reserved_bytes),
                floats(&t.reserved_bytes),
            ),
            (
                Samples::Column(&t.allocated_bytes),
                floats(&t.allocated_bytes),
            ),
            (Samples::Fragmentation(&t), frag),
        ];
        for (samples, copy) in cases {
            let levels = Levels::new(samples);
            let curve = levels.over(samples);
            let env = Envelope::new(copy.clone());
            assert_eq!(curve.len(), env.len());
            for i in 0..=copy.len() {
                assert_eq!(curve.get(i), env.get(i), "sample {i}");
            }
            for (lo, hi) in [
                (0, 5_000),
                (0, 1),
                (15, 17),
                (16, 4_112),
                (4_095, 4_097),
                (777, 3_333),
                (4_999, 9_000),
                (9, 9),
            ] {
                assert_eq!(curve.range(lo, hi), env.range(lo, hi), "{lo}..{hi}");
                assert_eq!(
                    curve.range(lo, hi),
                    (lo < hi.min(5_000)).then(|| min_max(&copy[lo..hi.min(5_000)]))
                );
            }
        }
    }
}
