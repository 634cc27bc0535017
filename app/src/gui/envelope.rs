//! Min/max envelopes of a metric column, for drawing a million samples in a few thousand
//! pixels: the column plus coarser levels of (min, max) per 16, 256, 4096, … samples, so
//! the range of any span of samples is found in O(16 · levels).

/// Samples per bucket grow by this factor per level.
const FANOUT: usize = 16;

/// A column and its min/max levels.
#[derive(Debug, Clone, Default)]
pub struct Envelope {
    base: Vec<f32>,
    /// `levels[l][i]`: (min, max) of samples `i·16^(l+1) .. (i+1)·16^(l+1)`.
    levels: Vec<Vec<(f32, f32)>>,
}

impl Envelope {
    /// Builds the levels of `values`.
    #[must_use]
    pub fn new(values: Vec<f32>) -> Envelope {
        let mut levels: Vec<Vec<(f32, f32)>> = Vec::new();
        let mut prev: Vec<(f32, f32)> = values.chunks(FANOUT).map(min_max).collect();
        while !prev.is_empty() {
            let next: Vec<(f32, f32)> = if prev.len() > 1 {
                prev.chunks(FANOUT).map(merge).collect()
            } else {
                Vec::new()
            };
            levels.push(prev);
            prev = next;
        }
        Envelope {
            base: values,
            levels,
        }
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
        let hi = hi.min(self.base.len());
        if lo >= hi {
            return None;
        }
        let mut acc = (f32::INFINITY, f32::NEG_INFINITY);
        let mut i = lo;
        while i < hi {
            // The coarsest aligned bucket that starts at i and fits.
            let mut size = 1usize;
            let mut level = None;
            for (l, lv) in self.levels.iter().enumerate() {
                let s = size * FANOUT;
                if i.is_multiple_of(s) && i + s <= hi && i / s < lv.len() {
                    size = s;
                    level = Some(l);
                } else {
                    break;
                }
            }
            if let Some(l) = level {
                acc = merge(&[acc, self.levels[l][i / size]]);
            } else {
                let v = self.base[i];
                acc = (acc.0.min(v), acc.1.max(v));
            }
            i += size;
        }
        Some(acc)
    }
}

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
