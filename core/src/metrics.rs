//! The metrics of a replay, each defined once (DESIGN.md, "Metrics").

use std::fmt::Write as _;

use crate::models::ModelStats;

/// Bytes held from the device and not allocated: `free = reserved − allocated`
/// ("reserved but unallocated" in PyTorch's words).
#[must_use]
pub fn free_bytes(s: &ModelStats) -> u64 {
    s.reserved_bytes.saturating_sub(s.allocated_bytes)
}

/// Fragmentation: `1 − largest free block / free`, over all free blocks (0 when nothing
/// is free) — the BFC/RMM definition `(free − largest) / free`.
#[must_use]
pub fn fragmentation(s: &ModelStats) -> f64 {
    let free = free_bytes(s);
    if free == 0 {
        return 0.0;
    }
    let largest = s.largest_free_bytes.min(free);
    1.0 - largest as f64 / free as f64
}

/// Integers below this are exact in f64.
const EXACT_F64: u64 = 1 << 53;

/// Whether `a` is strictly more fragmented than `b`, compared exactly:
/// `(free_a − largest_a) / free_a > (free_b − largest_b) / free_b` by cross-multiplying
/// (no division). [`fragmentation`] is monotone in that ratio, so the state this picks
/// as the most fragmented gives the largest [`fragmentation`] too.
#[must_use]
pub fn more_fragmented(a: &ModelStats, b: &ModelStats) -> bool {
    let ratio = |s: &ModelStats| {
        let free = free_bytes(s);
        (free - s.largest_free_bytes.min(free), free)
    };
    let ((na, da), (nb, db)) = (ratio(a), ratio(b));
    if da == 0 {
        return false;
    }
    if db == 0 {
        return na > 0;
    }
    if na == 0 || nb == 0 {
        return nb == 0 && na > 0;
    }
    // Once per replayed op, so first by the two products in f64 (wasm has no 64 × 64 →
    // 128 multiply, and even `checked_mul`'s overflow test calls one): below 2^53 each
    // operand is exact and each product within a relative 2^-53 of its value, so
    // products further apart than a relative 1e-12 compare as the exact ones do.
    if na.max(nb).max(da).max(db) < EXACT_F64 {
        let (l, r) = (na as f64 * db as f64, nb as f64 * da as f64);
        if l > r * (1.0 + 1e-12) {
            return true;
        }
        if r > l * (1.0 + 1e-12) {
            return false;
        }
    }
    // Near-equal ratios: exactly, in u64 where neither product overflows, else in u128.
    match (na.checked_mul(db), nb.checked_mul(da)) {
        (Some(l), Some(r)) => l > r,
        _ => u128::from(na) * u128::from(db) > u128::from(nb) * u128::from(da),
    }
}

/// Internal waste: bytes of live blocks beyond what their requests asked for (rounding
/// and unsplit slack): `allocated − requested`.
#[must_use]
pub fn internal_waste_bytes(s: &ModelStats) -> u64 {
    s.allocated_bytes.saturating_sub(s.requested_bytes)
}

/// Samples per block of a [`Column`] (a chunk of [`Column::read_chunk`], the last one
/// shorter).
pub const BLOCK: usize = 64;

/// A column of `u64` samples held exactly in fewer bytes: in blocks of 64, each block its
/// smallest sample and each sample's difference from it in the fewest whole bytes (0, 1,
/// 2, 4 or 8) that hold the block's largest difference. A memory curve moves little
/// within 64 ops — reserved bytes not at all between segment operations — so most blocks
/// take 0 to 4 bytes a sample, against 8 in a `Vec<u64>`. Any sample is read in constant
/// time ([`Column::get`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Column {
    /// Per sealed block: its smallest sample, and where its bytes start in `bytes`
    /// ([`Pieces`]' offsets, shifted left 3) with its width's code (the low 3 bits, an
    /// index into `WIDTHS`).
    #[serde(deserialize_with = "exact_vec")]
    blocks: Vec<(u64, u64)>,
    bytes: Pieces,
    /// The open block: fewer than 64 samples, as they came.
    tail: Vec<u64>,
}

/// The bytes of a [`Column`]'s sealed blocks in one piece per [`PIECE_BYTES`] of them at
/// most, a block's bytes never split between two, not in one vector: a vector grown by
/// doubling to the tens of MB a column of millions of ops takes leaves the blocks it grew
/// out of behind it, and in wasm, whose memory is never given back, those holes and the
/// next doubling were what the browser's worker and page grew to (the 1.12 GB snapshot's
/// columns: 64 MiB vectors made from 32 MiB ones, a dozen of them). A piece is made once
/// at its whole size (the first one grows up to it, for the many small columns), fits
/// the holes others left, and crosses to the page as a field short enough for its
/// decoder's window ([`exact_vec`], [`bytes`]).
///
/// Offsets are those of the pieces laid end to end, each [`PIECE_BYTES`] long: piece
/// `o >> PIECE_SHIFT`, byte `o & (PIECE_BYTES - 1)` in it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
struct Pieces(#[serde(deserialize_with = "exact_vec")] Vec<Piece>);

/// One of [`Pieces`], as serde's bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
struct Piece(#[serde(with = "bytes")] Vec<u8>);

/// `log2` of [`PIECE_BYTES`].
const PIECE_SHIFT: u32 = 18;

/// The most bytes a piece of a [`Column`]'s holds (256 KiB).
pub const PIECE_BYTES: usize = 1 << PIECE_SHIFT;

impl Pieces {
    /// Makes room for `need` bytes (at most a block's) in the last piece, or in a new
    /// one where they would not fit in it; returns the offset where they go.
    fn room(&mut self, need: usize) -> u64 {
        let fits = self
            .0
            .last()
            .is_some_and(|p| p.0.len() + need <= PIECE_BYTES);
        if need > 0 && !fits {
            // Past its first piece a column is long: each further one is made whole.
            let capacity = if self.0.is_empty() { need } else { PIECE_BYTES };
            self.0.push(Piece(Vec::with_capacity(capacity)));
        }
        let n = self.0.len() as u64;
        let Some(last) = self.0.last_mut().map(|p| &mut p.0) else {
            return 0;
        };
        if last.capacity() - last.len() < need {
            let grown = (last.capacity() * 2)
                .max(last.len() + need)
                .min(PIECE_BYTES);
            last.reserve_exact(grown - last.len());
        }
        ((n - 1) << PIECE_SHIFT) + last.len() as u64
    }

    /// The last piece, where [`Pieces::room`] made room for bytes.
    fn last(&mut self) -> &mut Vec<u8> {
        let n = self.0.len() - 1;
        &mut self.0[n].0
    }

    /// `len` bytes from offset `at`.
    fn slice(&self, at: u64, len: usize) -> &[u8] {
        if len == 0 {
            return &[];
        }
        let piece = &self.0[(at >> PIECE_SHIFT) as usize].0;
        let from = (at & (PIECE_BYTES as u64 - 1)) as usize;
        &piece[from..from + len]
    }

    /// The heap bytes held.
    fn capacity_bytes(&self) -> usize {
        self.0.capacity() * std::mem::size_of::<Piece>()
            + self.0.iter().map(|p| p.0.capacity()).sum::<usize>()
    }

    /// Frees the room no byte uses: the last piece's (the others are full but for less
    /// than a block).
    fn shrink_to_fit(&mut self) {
        self.0.shrink_to_fit();
        if let Some(p) = self.0.last_mut() {
            p.0.shrink_to_fit();
        }
    }
}

/// A column's vector decoded into exactly the length its encoding states (where memory
/// allows), as serde's own grows from at most 1 MiB by doubling: a column crosses to the
/// browser's page (a replay's timeline, the recorded curves, the ops' times), whose wasm
/// memory is never given back, and a doubled vector kept up to twice its bytes, beside the
/// old one while it grew. The app's wire messages decode their long vectors through it too
/// (the 1 M-event trace's 4.3 M band pieces: 137 MB of pieces, 402 MB at serde's last
/// doubling).
pub fn exact_vec<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    struct Exact<T>(std::marker::PhantomData<T>);
    impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Exact<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a sequence")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Vec<T>, A::Error> {
            collect_exact(seq)
        }
    }
    d.deserialize_seq(Exact(std::marker::PhantomData))
}

/// A sequence's elements in a vector of the length it states (where memory allows).
fn collect_exact<'de, A: serde::de::SeqAccess<'de>, T: serde::Deserialize<'de>>(
    mut seq: A,
) -> Result<Vec<T>, A::Error> {
    let mut out = Vec::new();
    // A length no memory can hold fails here, and the vector grows as it decodes.
    let _ = out.try_reserve_exact(seq.size_hint().unwrap_or(0));
    while let Some(x) = seq.next_element()? {
        out.push(x);
    }
    Ok(out)
}

/// A `Vec<u8>` as serde's bytes (`#[serde(with = "bytes")]`): postcard writes bytes as
/// it writes a sequence of `u8` (its length, then each byte as it is), so the encoding is
/// the same, but they are read and written whole, not through serde's visitor a byte at
/// a time — in the browser's page that took 1.5 s of the 1.12 GB snapshot's open (its ops
/// table's kinds and every column's bytes, tens of MB). A format that has no bytes of its
/// own (JSON: an array of numbers) reads them as a sequence, to the length stated.
pub mod bytes {
    pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct Bytes;
        impl<'de> serde::de::Visitor<'de> for Bytes {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Vec<u8>, A::Error> {
                super::collect_exact(seq)
            }
        }
        d.deserialize_byte_buf(Bytes)
    }
}

/// The widths a block's differences are stored in, in bytes.
const WIDTHS: [usize; 5] = [0, 1, 2, 4, 8];

impl Column {
    /// Appends one sample.
    pub fn push(&mut self, v: u64) {
        self.tail.push(v);
        if self.tail.len() == BLOCK {
            self.seal();
        }
    }

    /// Stores the open block, full, in its narrow form.
    fn seal(&mut self) {
        let (lo, hi) = self
            .tail
            .iter()
            .fold((u64::MAX, 0), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        let range = hi - lo;
        let code = WIDTHS
            .iter()
            .position(|&w| w == 8 || range < 1u64 << (8 * w))
            .unwrap_or(WIDTHS.len() - 1);
        let at = self.bytes.room(BLOCK * WIDTHS[code]);
        self.blocks.push((lo, at << 3 | code as u64));
        // One fixed-size write per sample (the replay pushes a sample per op).
        let d = self.tail.iter().map(|&v| v - lo);
        if code == 0 {
            self.tail.clear();
            return;
        }
        let out = self.bytes.last();
        match WIDTHS[code] {
            1 => out.extend(d.map(|x| x as u8)),
            2 => d.for_each(|x| out.extend_from_slice(&(x as u16).to_le_bytes())),
            4 => d.for_each(|x| out.extend_from_slice(&(x as u32).to_le_bytes())),
            _ => d.for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        }
        self.tail.clear();
    }

    /// Number of samples.
    #[must_use]
    pub fn len(&self) -> usize {
        self.blocks.len() * BLOCK + self.tail.len()
    }

    /// Whether there are no samples.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sample `i` (None past the end).
    #[must_use]
    pub fn get(&self, i: usize) -> Option<u64> {
        let (b, j) = (i / BLOCK, i % BLOCK);
        let Some(&(base, at)) = self.blocks.get(b) else {
            return self.tail.get(i - self.blocks.len() * BLOCK).copied();
        };
        let width = WIDTHS[(at & 7) as usize];
        let start = (at >> 3) + (j * width) as u64;
        let mut le = [0u8; 8];
        le[..width].copy_from_slice(self.bytes.slice(start, width));
        Some(base + u64::from_le_bytes(le))
    }

    /// The samples in order, a block decoded at a time.
    #[must_use]
    pub fn iter(&self) -> ColumnIter<'_> {
        ColumnIter {
            column: self,
            block: 0,
            buf: [0; BLOCK],
            next: 0,
            filled: 0,
        }
    }

    /// Chunks of its samples in order ([`Column::read_chunk`]): its blocks and the open
    /// one.
    #[must_use]
    pub fn chunk_count(&self) -> usize {
        self.blocks.len() + usize::from(!self.tail.is_empty())
    }

    /// Samples `b·64 ..` of chunk `b` (64 of them but in the last chunk), decoded into
    /// `out`; none past the last chunk. A reader of every sample takes them a chunk at a
    /// time so, not through [`ColumnIter`]'s call a sample.
    pub fn read_chunk<'o>(&self, b: usize, out: &'o mut [u64; BLOCK]) -> &'o [u64] {
        if b < self.blocks.len() {
            self.decode_block(b, out);
            return out;
        }
        if b > self.blocks.len() {
            return &[];
        }
        let n = self.tail.len();
        out[..n].copy_from_slice(&self.tail);
        &out[..n]
    }

    /// Writes sealed block `b`'s samples into `out`.
    fn decode_block(&self, b: usize, out: &mut [u64; BLOCK]) {
        let (base, at) = self.blocks[b];
        let width = WIDTHS[(at & 7) as usize];
        let bytes = self.bytes.slice(at >> 3, BLOCK * width);
        match width {
            0 => out.fill(base),
            1 => decode_each::<1>(out, bytes, |d| base + u64::from(d[0])),
            2 => decode_each::<2>(out, bytes, |d| base + u64::from(u16::from_le_bytes(d))),
            4 => decode_each::<4>(out, bytes, |d| base + u64::from(u32::from_le_bytes(d))),
            _ => decode_each::<8>(out, bytes, |d| base + u64::from_le_bytes(d)),
        }
    }

    /// The samples as a plain vector.
    #[must_use]
    pub fn to_vec(&self) -> Vec<u64> {
        self.iter().collect()
    }

    /// The heap bytes held (the capacity).
    #[must_use]
    pub fn capacity_bytes(&self) -> usize {
        self.blocks.capacity() * std::mem::size_of::<(u64, u64)>()
            + self.bytes.capacity_bytes()
            + self.tail.capacity() * 8
    }

    /// Frees the room no sample uses (for a column that is complete).
    pub fn shrink_to_fit(&mut self) {
        self.blocks.shrink_to_fit();
        self.bytes.shrink_to_fit();
        self.tail.shrink_to_fit();
    }
}

/// Writes `read` of each `W`-byte difference of a block into `out`: one loop per width,
/// a fixed-size read per sample.
fn decode_each<const W: usize>(
    out: &mut [u64; BLOCK],
    bytes: &[u8],
    read: impl Fn([u8; W]) -> u64,
) {
    for (o, d) in out.iter_mut().zip(bytes.chunks_exact(W)) {
        *o = read(d.try_into().unwrap_or([0; W]));
    }
}

/// A [`Column`]'s samples in order ([`Column::iter`]).
#[derive(Debug, Clone)]
pub struct ColumnIter<'a> {
    column: &'a Column,
    /// The next sealed block to decode.
    block: usize,
    buf: [u64; BLOCK],
    next: usize,
    filled: usize,
}

impl Iterator for ColumnIter<'_> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        if self.next == self.filled {
            let c = self.column;
            match self.block.cmp(&c.blocks.len()) {
                std::cmp::Ordering::Less => {
                    c.decode_block(self.block, &mut self.buf);
                    self.filled = BLOCK;
                }
                std::cmp::Ordering::Equal => {
                    self.buf[..c.tail.len()].copy_from_slice(&c.tail);
                    self.filled = c.tail.len();
                }
                std::cmp::Ordering::Greater => return None,
            }
            self.block += 1;
            self.next = 0;
            if self.filled == 0 {
                return None;
            }
        }
        self.next += 1;
        Some(self.buf[self.next - 1])
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        // Buffer `block - 1` is the one being read; every block before it is read.
        let done = self.block.saturating_sub(1) * BLOCK + self.next;
        let left = self.column.len() - done;
        (left, Some(left))
    }
}

impl ExactSizeIterator for ColumnIter<'_> {}

impl<'a> IntoIterator for &'a Column {
    type Item = u64;
    type IntoIter = ColumnIter<'a>;

    fn into_iter(self) -> ColumnIter<'a> {
        self.iter()
    }
}

impl FromIterator<u64> for Column {
    fn from_iter<I: IntoIterator<Item = u64>>(iter: I) -> Column {
        let mut c = Column::default();
        for v in iter {
            c.push(v);
        }
        c.shrink_to_fit();
        c
    }
}

/// The metrics timeline: one sample after every op, stored column by column, each a
/// [`Column`] (exact, in blocks of the fewest bytes; the op's time is the trace's,
/// `Op::time_us`, not kept again here).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Timeline {
    pub reserved_bytes: Column,
    pub allocated_bytes: Column,
    pub requested_bytes: Column,
    pub largest_free_bytes: Column,
    /// Free holes, at most `u32::MAX`.
    pub free_holes: Column,
}

impl Timeline {
    /// Appends one sample.
    pub fn push(&mut self, s: &ModelStats) {
        self.reserved_bytes.push(s.reserved_bytes);
        self.allocated_bytes.push(s.allocated_bytes);
        self.requested_bytes.push(s.requested_bytes);
        self.largest_free_bytes.push(s.largest_free_bytes);
        self.free_holes.push(s.free_holes.min(u64::from(u32::MAX)));
    }

    /// Appends one sample of the columns a plot of the timeline draws (reserved, allocated,
    /// largest free), leaving requested bytes and free holes out: a replay without
    /// `ReplayOptions::keep_requested` (the app's, which draws neither; its CSV export
    /// replays again with them).
    pub fn push_drawn(&mut self, s: &ModelStats) {
        self.reserved_bytes.push(s.reserved_bytes);
        self.allocated_bytes.push(s.allocated_bytes);
        self.largest_free_bytes.push(s.largest_free_bytes);
    }

    /// Whether it keeps every column (requested bytes and free holes too): only then are
    /// [`Timeline::stats_at`] and the CSV defined.
    #[must_use]
    pub fn keeps_every_column(&self) -> bool {
        self.requested_bytes.len() == self.len() && self.free_holes.len() == self.len()
    }

    /// The columns.
    fn columns(&self) -> [&Column; 5] {
        [
            &self.reserved_bytes,
            &self.allocated_bytes,
            &self.requested_bytes,
            &self.largest_free_bytes,
            &self.free_holes,
        ]
    }

    /// The heap bytes its columns hold (their capacity).
    #[must_use]
    pub fn capacity_bytes(&self) -> usize {
        self.columns().iter().map(|c| c.capacity_bytes()).sum()
    }

    /// Frees the room no sample uses (once the replay is done).
    pub fn shrink_to_fit(&mut self) {
        for c in [
            &mut self.reserved_bytes,
            &mut self.allocated_bytes,
            &mut self.requested_bytes,
            &mut self.largest_free_bytes,
            &mut self.free_holes,
        ] {
            c.shrink_to_fit();
        }
    }

    /// Number of samples.
    #[must_use]
    pub fn len(&self) -> usize {
        self.reserved_bytes.len()
    }

    /// Whether there are no samples.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.reserved_bytes.is_empty()
    }

    /// The stats of sample `i` (`segment_ops` not kept per sample) of a timeline that keeps
    /// every column ([`Timeline::keeps_every_column`]).
    #[must_use]
    pub fn stats_at(&self, i: usize) -> ModelStats {
        let at = |c: &Column| c.get(i).expect("a sample of the timeline");
        ModelStats {
            reserved_bytes: at(&self.reserved_bytes),
            allocated_bytes: at(&self.allocated_bytes),
            requested_bytes: at(&self.requested_bytes),
            largest_free_bytes: at(&self.largest_free_bytes),
            free_holes: at(&self.free_holes),
            segment_ops: 0,
        }
    }

    /// Fragmentation of sample `i`.
    #[must_use]
    pub fn fragmentation_at(&self, i: usize) -> f64 {
        fragmentation(&self.stats_at(i))
    }

    /// The metrics as CSV (`op,time_us,reserved_bytes,…`); `time_us[i]` is sample `i`'s
    /// time (0 past its end: a trace without times). Every column kept.
    #[must_use]
    pub fn to_csv(&self, time_us: &[i64]) -> String {
        let mut s = String::from(CSV_HEADER);
        self.csv_rows(
            0..self.len(),
            |i| time_us.get(i).copied().unwrap_or(0),
            &mut s,
        );
        s
    }

    /// Appends the CSV rows of samples `rows` (clamped to the timeline) to `out`, sample
    /// `i`'s time being `time_us(i)`: the CSV written a piece at a time (after
    /// [`CSV_HEADER`]), so a long one is never held whole. Every column kept.
    pub fn csv_rows(
        &self,
        rows: std::ops::Range<usize>,
        time_us: impl Fn(usize) -> i64,
        out: &mut String,
    ) {
        for i in rows.start..rows.end.min(self.len()) {
            csv_row(i, time_us(i), &self.stats_at(i), out);
        }
    }
}

/// Appends the CSV row of sample `i` (at `time_us`, with stats `st`) to `out`: a line of
/// [`Timeline::to_csv`], for a caller that reads the samples as a replay makes them.
pub fn csv_row(i: usize, time_us: i64, st: &ModelStats, out: &mut String) {
    let _ = writeln!(
        out,
        "{i},{time_us},{},{},{},{},{},{},{:.6}",
        st.reserved_bytes,
        st.allocated_bytes,
        st.requested_bytes,
        free_bytes(st),
        st.largest_free_bytes,
        st.free_holes.min(u64::from(u32::MAX)),
        fragmentation(st)
    );
}

/// The first line of [`Timeline::to_csv`].
pub const CSV_HEADER: &str = "op,time_us,reserved_bytes,allocated_bytes,requested_bytes,free_bytes,largest_free_bytes,free_holes,fragmentation\n";

#[cfg(test)]
mod tests {
    use super::*;

    /// A xorshift generator from `seed` (not 0).
    fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    #[test]
    fn the_exact_comparison_finds_the_float_maximum() {
        let mut next = xorshift(0x2545_F491_4F6C_DD1D);
        let mut best = ModelStats::default();
        let mut float_max = 0f64;
        for _ in 0..100_000 {
            let reserved = next() % (1 << 40);
            let allocated = next() % (reserved + 1);
            let s = ModelStats {
                reserved_bytes: reserved,
                allocated_bytes: allocated,
                // Sometimes beyond the free bytes (clamped), sometimes equal.
                largest_free_bytes: match next() % 4 {
                    0 => reserved - allocated,
                    1 => reserved,
                    _ => next() % (reserved - allocated + 1),
                },
                ..ModelStats::default()
            };
            float_max = float_max.max(fragmentation(&s));
            if more_fragmented(&s, &best) {
                best = s;
            }
            assert!(!more_fragmented(&s, &s));
        }
        assert!(float_max > 0.99);
        assert_eq!(fragmentation(&best).to_bits(), float_max.to_bits());
    }

    #[test]
    fn the_shortcuts_compare_as_the_u128_products_do() {
        let mut next = xorshift(0x51_7CC1_B727_220A);
        let stats = |r: u64, a: u64, l: u64| ModelStats {
            reserved_bytes: r,
            allocated_bytes: a,
            largest_free_bytes: l,
            ..ModelStats::default()
        };
        for k in 0..200_000u32 {
            // Byte counts of every width, so both sides overflow u64 or not in turn.
            let mut v = || next() >> (next() % 64);
            let (a, b) = (stats(v(), v(), v()), stats(v(), v(), v()));
            let (a, b) = match k % 7 {
                0 => (a, a),
                // Ratios equal or a unit apart (the f64 quotients cannot tell them
                // apart): scaled copies of one state, nudged by one byte.
                1 | 2 => {
                    let (free, large) = (v() >> 12, v() >> 12);
                    let m = 1 + (next() >> 54);
                    let nudge = u64::from(k % 7 == 2);
                    (
                        stats(free, 0, large),
                        stats(free * m, 0, (large * m).saturating_sub(nudge)),
                    )
                }
                _ => (a, b),
            };
            let ratio = |s: &ModelStats| {
                let free = free_bytes(s);
                (
                    u128::from(free - s.largest_free_bytes.min(free)),
                    u128::from(free),
                )
            };
            let ((na, da), (nb, db)) = (ratio(&a), ratio(&b));
            let want = da != 0 && (if db == 0 { na > 0 } else { na * db > nb * da });
            assert_eq!(more_fragmented(&a, &b), want, "{a:?} against {b:?}");
        }
    }

    #[test]
    fn a_column_gives_back_every_sample_exactly_in_fewer_bytes() {
        /// A column's fields, each piece of its bytes written as a sequence of `u8`s.
        #[derive(serde::Serialize)]
        struct AsSequence<'a> {
            blocks: &'a [(u64, u64)],
            bytes: Vec<&'a [u8]>,
            tail: &'a [u64],
        }
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
        // Runs of samples whose spread needs each width: constant (0 bytes), < 2^8,
        // < 2^16, < 2^32, the whole u64 range; a run crosses block boundaries.
        let mut want = Vec::new();
        let base = next() >> 1;
        for (run, spread) in [
            (200, 0),
            (100, 1 << 8),
            (130, 1 << 16),
            (64, 1 << 32),
            (90, 0),
        ] {
            for _ in 0..run {
                want.push(if spread == 0 {
                    base
                } else {
                    base + next() % spread
                });
            }
        }
        want.extend([u64::MAX, 0, u64::MAX, 7]);
        let mut c = Column::default();
        for (i, &v) in want.iter().enumerate() {
            c.push(v);
            assert_eq!(c.len(), i + 1);
            assert_eq!(c.get(i), Some(v), "sample {i} as pushed");
        }
        assert_eq!(c.get(want.len()), None);
        assert_eq!(c.to_vec(), want);
        let collected: Column = want.iter().copied().collect();
        assert_eq!(collected, c);
        for (i, &v) in want.iter().enumerate() {
            assert_eq!(c.get(i), Some(v), "sample {i}");
        }
        // Read in order a block at a time: the same samples, for a column ending on a
        // block's boundary, inside one, or empty; its length known at every step.
        for n in [0, 1, 63, 64, 65, 128, 200, 300, want.len()] {
            let c: Column = want[..n].iter().copied().collect();
            let mut it = c.iter();
            for (i, &v) in want[..n].iter().enumerate() {
                assert_eq!(it.len(), n - i, "{n} samples, at {i}");
                assert_eq!(it.next(), Some(v), "{n} samples, sample {i}");
            }
            assert_eq!((it.len(), it.next(), it.next()), (0, None, None), "{n}");
            // And a chunk of 64 at a time: the same samples, then nothing.
            let mut buf = [0u64; BLOCK];
            let mut chunked = Vec::new();
            for b in 0..c.chunk_count() {
                let chunk = c.read_chunk(b, &mut buf);
                assert_eq!(
                    chunk.len(),
                    BLOCK.min(n - b * BLOCK),
                    "{n} samples, chunk {b}"
                );
                chunked.extend_from_slice(chunk);
            }
            assert_eq!(chunked, want[..n], "{n}");
            assert!(c.read_chunk(c.chunk_count(), &mut buf).is_empty(), "{n}");
        }
        // Postcard writes its bytes as serde's bytes, the same encoding as a sequence of
        // `u8`s: a column reads back from either.
        let encoded = postcard::to_allocvec(&c).expect("encodes");
        assert_eq!(
            postcard::from_bytes::<Column>(&encoded).ok(),
            Some(c.clone())
        );
        let as_sequence = postcard::to_allocvec(&AsSequence {
            blocks: &c.blocks,
            bytes: c.bytes.0.iter().map(|p| &p.0[..]).collect(),
            tail: &c.tail,
        })
        .expect("encodes");
        assert_eq!(as_sequence, encoded);
        let json = serde_json::to_string(&c).expect("encodes");
        assert_eq!(serde_json::from_str::<Column>(&json).ok(), Some(c.clone()));
        // The constant runs take no bytes, the narrow ones their width: far below 8 a sample.
        let held = collected.capacity_bytes();
        assert!(held < 3 * want.len(), "{held} bytes");
        assert!(Column::default().is_empty());
    }

    #[test]
    fn a_long_column_keeps_its_bytes_in_pieces_no_block_split() {
        // Blocks of every width in turn, 8 bytes a sample most often: tens of pieces,
        // each ending where the next block would not fit whole.
        let mut next = xorshift(0x2545_F491_4F6C_DD1D);
        let want: Vec<u64> = (0..1_500_000u64)
            .map(|i| match (i / BLOCK as u64) % 7 {
                0 => 42,
                1 => i % 200,
                2 => (1 << 40) | (next() % (1 << 16)),
                3 => next() % (1 << 32),
                _ => next(),
            })
            .collect();
        let c: Column = want.iter().copied().collect();
        let pieces = &c.bytes.0;
        assert!(pieces.len() > 20, "{} pieces", pieces.len());
        let widest = BLOCK * 8;
        for (k, p) in pieces.iter().enumerate() {
            assert!(
                p.0.capacity() <= PIECE_BYTES,
                "piece {k}: {}",
                p.0.capacity()
            );
            if k + 1 < pieces.len() {
                assert!(
                    p.0.len() + widest > PIECE_BYTES,
                    "piece {k} ends early: {}",
                    p.0.len()
                );
            }
        }
        // Every sample read back one at a time, a block at a time, and after a round trip.
        for (i, &v) in want.iter().enumerate().step_by(7) {
            assert_eq!(c.get(i), Some(v), "sample {i}");
        }
        assert_eq!(c.to_vec(), want);
        let back: Column =
            postcard::from_bytes(&postcard::to_allocvec(&c).expect("encodes")).expect("decodes");
        assert_eq!(back, c);
        assert_eq!(back.to_vec(), want);
        // Pushed one at a time, the same pieces; held in little more than their bytes.
        let mut pushed = Column::default();
        for &v in &want {
            pushed.push(v);
        }
        pushed.shrink_to_fit();
        assert_eq!(pushed, c);
        let used: usize = pieces.iter().map(|p| p.0.len()).sum();
        assert!(c.capacity_bytes() < used + used / 50 + c.blocks.len() * 16 + 4096);
    }

    #[test]
    fn a_timeline_gives_back_the_stats_it_was_given() {
        let mut t = Timeline::default();
        let stats: Vec<ModelStats> = (0..300u64)
            .map(|i| ModelStats {
                reserved_bytes: (i / 100 + 1) << 30,
                allocated_bytes: i * 512,
                requested_bytes: i * 500,
                largest_free_bytes: (i % 7) << 20,
                free_holes: if i == 299 { u64::MAX } else { i % 5 },
                segment_ops: 0,
            })
            .collect();
        for s in &stats {
            t.push(s);
        }
        t.shrink_to_fit();
        assert_eq!(t.len(), 300);
        for (i, s) in stats.iter().enumerate() {
            let free_holes = s.free_holes.min(u64::from(u32::MAX));
            assert_eq!(t.stats_at(i), ModelStats { free_holes, ..*s }, "sample {i}");
        }
        let csv = t.to_csv(&[5, 6]);
        let rows: Vec<&str> = csv.lines().collect();
        assert_eq!(rows.len(), 301);
        assert!(rows[1].starts_with("0,5,1073741824,0,0,"), "{}", rows[1]);
        assert!(
            rows[3].starts_with("2,0,1073741824,1024,1000,"),
            "{}",
            rows[3]
        );
    }

    #[test]
    fn fragmentation_is_zero_without_free_memory_and_grows_with_holes() {
        let mut s = ModelStats {
            reserved_bytes: 100,
            allocated_bytes: 100,
            ..ModelStats::default()
        };
        assert!(fragmentation(&s).abs() < f64::EPSILON);
        s.allocated_bytes = 60;
        s.largest_free_bytes = 40;
        assert!(fragmentation(&s).abs() < f64::EPSILON);
        s.largest_free_bytes = 10;
        assert!((fragmentation(&s) - 0.75).abs() < 1e-12);
    }
}
