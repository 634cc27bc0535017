//! What a replay's op stepper keeps per op — the address an alloc was served at, or that
//! the program never held its memory — in chunks that a replay shares with its forks.
//! An op's entry is written only when that op is stepped, so the entries before a fork
//! (`ReplayRun::fork`, once per setting `core::prefix` forks) never change again on
//! either side: a fork copies a chunk only where it first writes into one it shares, not
//! the whole trace's worth (8 bytes an op) as a plain vector's copy would.

use std::rc::Rc;

/// Entries per chunk.
const CHUNK: usize = 4096;

/// Per-op entries: 0 until written (a chunk never written is not allocated).
#[derive(Debug, Clone, Default)]
pub(crate) struct OpAddrs {
    chunks: Vec<Option<Rc<[u64]>>>,
    /// Entries held: `get` answers below it.
    len: usize,
}

impl OpAddrs {
    /// `len` entries, all 0.
    #[must_use]
    pub(crate) fn zeroed(len: usize) -> OpAddrs {
        OpAddrs {
            chunks: Vec::new(),
            len,
        }
    }

    /// Entries held.
    #[must_use]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Entry `i` (`i < len`).
    #[inline]
    #[must_use]
    pub(crate) fn get(&self, i: usize) -> u64 {
        debug_assert!(i < self.len, "entry {i} of {}", self.len);
        match self.chunks.get(i / CHUNK) {
            Some(Some(c)) => c[i % CHUNK],
            _ => 0,
        }
    }

    /// Sets entry `i`, holding at least `i + 1` entries; copies its chunk first where a
    /// fork shares it.
    #[inline]
    pub(crate) fn set(&mut self, i: usize, v: u64) {
        self.len = self.len.max(i + 1);
        let c = i / CHUNK;
        if c >= self.chunks.len() {
            self.chunks.resize(c + 1, None);
        }
        let chunk = self.chunks[c].get_or_insert_with(|| Rc::from(vec![0; CHUNK]));
        Rc::make_mut(chunk)[i % CHUNK] = v;
    }

    /// Holds at least `len` entries (the new ones 0).
    pub(crate) fn grow_to(&mut self, len: usize) {
        self.len = self.len.max(len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_keeps_its_own_entries_and_shares_the_rest() {
        let n = 3 * CHUNK + 17;
        let mut a = OpAddrs::zeroed(n);
        let mut want = vec![0u64; n];
        for i in (0..n).step_by(3) {
            a.set(i, i as u64 + 1);
            want[i] = i as u64 + 1;
        }
        let mut b = a.clone();
        let mut want_b = want.clone();
        // Both write past the fork, into a shared chunk and beyond the old length.
        for i in [CHUNK + 1, 2 * CHUNK + 5, n + 3] {
            a.set(i, 7);
            b.set(i, 9);
            if i < n {
                want[i] = 7;
                want_b[i] = 9;
            } else {
                want.resize(i + 1, 0);
                want_b.resize(i + 1, 0);
                want[i] = 7;
                want_b[i] = 9;
            }
        }
        assert_eq!(a.len(), want.len());
        assert_eq!(b.len(), want_b.len());
        assert!((0..a.len()).all(|i| a.get(i) == want[i]));
        assert!((0..b.len()).all(|i| b.get(i) == want_b[i]));
        // The chunk neither wrote after the fork is still one allocation.
        assert!(Rc::ptr_eq(
            a.chunks[0].as_ref().unwrap(),
            b.chunks[0].as_ref().unwrap()
        ));
        let mut c = OpAddrs::zeroed(0);
        assert_eq!(c.len(), 0);
        c.grow_to(5);
        assert_eq!((c.len(), c.get(4)), (5, 0));
    }
}
