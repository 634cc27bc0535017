//! A snapshot decoded from its file read in pieces, so that no caller holds the whole
//! file: the desktop app's engine thread, the browser's worker (slices of a `File`), the
//! CLI. Formats are told apart as [`super::import::decode_snapshot`] does, with the same
//! limits, answers and errors:
//! - **a pickle** is read twice ([`super::pickle::PickleStream`]): the pre-pass, then
//!   the machine over windows of the input; nothing of the file is held but the window;
//! - **gzip** is inflated as it is fed ([`super::gzip::Gunzip`], under the same cap on
//!   what it may inflate to), the inflated bytes going on to the pickle's pre-pass as they
//!   come, so reading, inflating and the pre-pass overlap; the inflated bytes are kept
//!   for the second pass (up to [`KEEP_INFLATED_BYTES`]; past it the compressed file is
//!   kept instead and inflated again): its file is read once, and inflated once;
//! - **JSON** (and anything else: its error) is collected whole and decoded at the end.
//!
//! [`StreamDecoder`] is fed by whoever reads ([`StreamDecoder::feed`], then
//! [`StreamDecoder::end_of_input`], which may ask for the file again from its start);
//! [`decode_from`] drives it over any re-readable source with progress and cancel.

use std::io::Read;

use super::RawSnapshot;
use super::error::ImportError;
use super::gzip::Gunzip;
use super::import::{DecodeOptions, decode_plain, decompression_cap, gunzip_pieces, is_gzip};
use super::pickle::{PickleStream, SINGLE_PASS_MAX_BYTES, WINDOW_STEP};

/// How far a streamed decode is: the pass over the file (1 or 2) and the bytes of the file
/// it has been through in this pass. A gzip file is read and inflated in pass 1; its pass
/// 2 goes over the inflated bytes kept in memory, which `bytes_done` and `bytes_total`
/// then count (or, past [`KEEP_INFLATED_BYTES`], over the compressed file inflated again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub pass: u8,
    /// The passes the decode takes: 2, or 1 for a pickle decoded in a single pass (3
    /// where that gave way to two: [`super::pickle::PickleStream::single_pass`]).
    pub passes: u8,
    pub bytes_done: u64,
    pub bytes_total: u64,
}

impl Progress {
    /// The share of the work done, 0 to 1 (each pass an equal part of it).
    #[must_use]
    pub fn fraction(&self) -> f32 {
        let within = if self.bytes_total == 0 {
            1.0
        } else {
            (self.bytes_done as f64 / self.bytes_total as f64).min(1.0)
        };
        let done =
            (f64::from(self.pass.saturating_sub(1)) + within) / f64::from(self.passes.max(1));
        done.min(1.0) as f32
    }
}

/// Inflated bytes that are not kept are handed on in pieces of (at most) this size.
const GZIP_PIECE: usize = 4 << 20;

/// Inflated bytes are kept in chunks of this size (freed one by one as the second pass
/// runs over them). What the browser's engine worker holds after an open (decode, build,
/// replays; `web/tests/bench.mjs`) was lowest with 4 MiB: 48 MiB on `kvcache_decode` and
/// 78 on `big_gpt_long_stacks_s9` (main, inflating twice: 50 and 81; chunks of 1 MiB: 56
/// and 83), though the decode alone peaks lower with 1 MiB (`scripts/wasm-decode-probe`:
/// 36.4 and 62.4 MiB against 48 and 78.1).
const KEPT_CHUNK_BYTES: usize = 4 << 20;

/// A gzip file's inflated bytes are kept for the second pass while they total at most this
/// (256 MiB, the browser's bound on a file read whole): every real snapshot we know of
/// inflates to far less (32 MB), and a bigger one keeps only its compressed file (a tenth
/// of it) and is inflated again, as before, so that what a huge file holds stays bounded
/// (wasm's memory ends at 4 GiB). The kept chunks are dropped as the second pass runs
/// over them. What keeping costs: the decode alone peaks higher in wasm
/// (`scripts/wasm-decode-probe`: 48 MiB against 44.8 on `kvcache_decode`, 14.6 MB
/// inflated; 78.1 against 58.6 on `big_gpt_long_stacks_s9`, 32 MB), though the browser's
/// engine worker after the whole open does not (see `KEPT_CHUNK_BYTES`).
pub const KEEP_INFLATED_BYTES: u64 = 256 << 20;

/// A gzip file is kept inflated only where it is at most 1/16 of [`KEEP_INFLATED_BYTES`]
/// compressed (16 MiB): `PyTorch`'s pickles compress 10–13:1, so a larger file would most
/// likely pass the bound and leave the 256 MiB it filled to wasm's memory, which never
/// shrinks, before falling back.
const KEEP_MAX_COMPRESSED_BYTES: u64 = KEEP_INFLATED_BYTES / 16;

/// What the uncompressed stream turned out to be.
#[derive(Debug)]
enum Plain {
    /// No byte yet.
    Unknown,
    Pickle(PickleStream),
    /// Anything else (JSON, or bytes whose error [`decode_plain`] names), whole.
    Whole(Vec<u8>),
}

/// The file, once its first bytes tell.
#[derive(Debug)]
enum FileKind {
    Unknown,
    Plain,
    Gzip(Box<GzipFile>),
}

/// A gzip file being inflated as it is fed, and what its second pass will need.
#[derive(Debug)]
struct GzipFile {
    gunzip: Gunzip,
    /// The inflated bytes, for the second pass: `None` once they are more than the bound,
    /// or once they turn out to be no pickle (decoded whole, in one pass).
    kept: Option<Kept>,
    /// The compressed file as fed, to inflate again should the inflated bytes not be kept
    /// (`None` once it is known not to be needed).
    compressed: Option<Vec<u8>>,
    /// Where bytes are inflated to when they are not kept.
    scratch: Vec<u8>,
}

/// Inflated bytes kept in chunks of [`KEPT_CHUNK_BYTES`] (never reallocated, nor copied:
/// they are inflated in place), at most `bound_bytes` in all.
#[derive(Debug)]
struct Kept {
    chunks: Vec<Vec<u8>>,
    /// Bytes of the last chunk written (the chunks are allocated zeroed, whole).
    filled: usize,
    total_bytes: u64,
    bound_bytes: u64,
}

impl Kept {
    /// Room in the last chunk, a new chunk where it is full; `None` once the bytes kept
    /// reach the bound.
    fn room(&mut self) -> Option<&mut [u8]> {
        if self.chunks.last().is_none_or(|c| self.filled == c.len()) {
            let left = self.bound_bytes.saturating_sub(self.total_bytes);
            let len = usize::try_from(left)
                .unwrap_or(usize::MAX)
                .min(KEPT_CHUNK_BYTES);
            if len == 0 {
                return None;
            }
            self.chunks.push(vec![0; len]);
            self.filled = 0;
        }
        let filled = self.filled;
        self.chunks.last_mut().and_then(|c| c.get_mut(filled..))
    }

    /// The `bytes` just written into [`Kept::room`].
    fn wrote(&mut self, bytes: usize) -> &[u8] {
        let from = self.filled;
        self.filled += bytes;
        self.total_bytes += bytes as u64;
        self.chunks
            .last()
            .and_then(|c| c.get(from..from + bytes))
            .unwrap_or(&[])
    }

    /// The chunks, the last cut to what was written.
    fn into_chunks(mut self) -> Vec<Vec<u8>> {
        if let Some(last) = self.chunks.last_mut() {
            last.truncate(self.filled);
        }
        self.chunks
    }
}

impl GzipFile {
    fn new(limit_bytes: u64, keep_bytes: u64, file_len: u64) -> GzipFile {
        GzipFile {
            gunzip: Gunzip::new(limit_bytes),
            kept: (file_len <= KEEP_MAX_COMPRESSED_BYTES).then_some(Kept {
                chunks: Vec::new(),
                filled: 0,
                total_bytes: 0,
                bound_bytes: keep_bytes,
            }),
            compressed: Some(Vec::with_capacity(
                usize::try_from(file_len.min(1 << 32)).unwrap_or(0),
            )),
            scratch: Vec::new(),
        }
    }

    /// Inflates the next piece of the file, handing what it inflates to `plain` (the
    /// first pass), keeping it where it is kept.
    fn feed(
        &mut self,
        piece: &[u8],
        plain: &mut Plain,
        window_step: u64,
    ) -> Result<(), ImportError> {
        if let Some(compressed) = &mut self.compressed {
            compressed.extend_from_slice(piece);
        }
        let mut rest = piece;
        loop {
            let room = if let Some(room) = self.kept.as_mut().and_then(Kept::room) {
                room
            } else {
                // Past the bound (or never kept): what is inflated goes on to the pre-pass
                // through one buffer.
                self.kept = None;
                if self.scratch.is_empty() {
                    self.scratch = vec![0; GZIP_PIECE];
                }
                &mut self.scratch
            };
            let (read, written) = self.gunzip.inflate(rest, room)?;
            rest = rest.get(read..).unwrap_or(&[]);
            let inflated = match &mut self.kept {
                Some(kept) => kept.wrote(written),
                None => self.scratch.get(..written).unwrap_or(&[]),
            };
            plain_feed(plain, inflated, None, None, window_step)?;
            if let Plain::Whole(_) = plain {
                // Decoded whole at the end, in one pass: nothing to keep for another.
                self.kept = None;
                self.compressed = None;
            }
            if read == 0 && written == 0 {
                return Ok(());
            }
        }
    }

    /// The second pass: the kept inflated bytes (dropped as they are fed), or the
    /// compressed file inflated again, handed to `plain`; a pass after it (the pickle's
    /// second pass run once more, [`PickleStream::passes`]) inflates the file again.
    fn second_pass(
        &mut self,
        plain: &mut Plain,
        limit_bytes: u64,
        window_step: u64,
        progress: &mut dyn FnMut(Progress) -> bool,
    ) -> Result<(), ImportError> {
        let (pass, passes) = match plain {
            Plain::Pickle(p) => p.passes(),
            _ => (2, 2),
        };
        let report = |bytes_done, bytes_total, progress: &mut dyn FnMut(Progress) -> bool| {
            let p = Progress {
                pass,
                passes,
                bytes_done,
                bytes_total,
            };
            if progress(p) {
                Ok(())
            } else {
                Err(ImportError::Cancelled)
            }
        };
        if let Some(kept) = self.kept.take() {
            let total = kept.total_bytes;
            let mut done = 0u64;
            for chunk in kept.into_chunks() {
                plain_feed(plain, &chunk, None, None, window_step)?;
                done += chunk.len() as u64;
                report(done, total, progress)?;
            }
            return Ok(());
        }
        let compressed = self.compressed.as_deref().unwrap_or_default();
        let total = compressed.len() as u64;
        gunzip_pieces(compressed, limit_bytes, GZIP_PIECE, &mut |piece, read| {
            report(read, total, progress)?;
            plain_feed(plain, piece, None, None, window_step)
        })?;
        // Its last piece may have been handed on before the member's trailer was read.
        report(total, total, progress)
    }
}

/// A snapshot decoded from pieces of its file.
#[derive(Debug)]
pub struct StreamDecoder {
    options: DecodeOptions,
    /// The file's size, as the caller gives it.
    file_len: u64,
    /// Bytes of the file fed in this pass.
    fed: u64,
    pass: u8,
    /// The file's first bytes until gzip can be told apart (two bytes).
    head: Vec<u8>,
    file: FileKind,
    plain: Plain,
    window_step: u64,
    /// A gzip file's inflated bytes are kept while they total at most this.
    keep_bytes: u64,
    /// A plain pickle up to this size is decoded in a single pass.
    single_pass_max: u64,
}

impl StreamDecoder {
    /// A decoder of a file of `file_len` bytes.
    #[must_use]
    pub fn new(file_len: u64, options: DecodeOptions) -> StreamDecoder {
        StreamDecoder {
            options,
            file_len,
            fed: 0,
            pass: 1,
            head: Vec::new(),
            file: FileKind::Unknown,
            plain: Plain::Unknown,
            window_step: WINDOW_STEP,
            keep_bytes: KEEP_INFLATED_BYTES,
            single_pass_max: SINGLE_PASS_MAX_BYTES,
        }
    }

    /// A plain pickle is decoded in a single pass while it is at most `bytes`
    /// ([`SINGLE_PASS_MAX_BYTES`]; tests: 0, the two passes always).
    #[must_use]
    pub fn with_single_pass_max(mut self, bytes: u64) -> StreamDecoder {
        self.single_pass_max = bytes;
        self
    }

    /// The machine runs over windows of about `bytes` (tests: many windows on a small
    /// file).
    #[must_use]
    pub fn with_window_step(mut self, bytes: u64) -> StreamDecoder {
        self.window_step = bytes;
        self
    }

    /// A gzip file's inflated bytes are kept for the second pass while they total at most
    /// `bytes` ([`KEEP_INFLATED_BYTES`]; tests: the compressed file inflated again past it).
    #[must_use]
    pub fn with_keep_bound(mut self, bytes: u64) -> StreamDecoder {
        self.keep_bytes = bytes;
        self
    }

    /// The pass the next bytes belong to (1, or 2 once [`StreamDecoder::end_of_input`]
    /// asked for the file again).
    #[must_use]
    pub fn pass(&self) -> u8 {
        self.passes().0
    }

    /// The pass the next bytes belong to, of how many.
    fn passes(&self) -> (u8, u8) {
        match (&self.file, &self.plain) {
            (FileKind::Plain, Plain::Pickle(p)) => p.passes(),
            _ => (self.pass, 2),
        }
    }

    /// The progress after the bytes fed so far.
    #[must_use]
    pub fn progress(&self) -> Progress {
        let (pass, passes) = self.passes();
        Progress {
            pass,
            passes,
            bytes_done: self.fed,
            bytes_total: self.file_len,
        }
    }

    /// The next piece of the file, in order.
    pub fn feed(&mut self, piece: &[u8]) -> Result<(), ImportError> {
        self.fed += piece.len() as u64;
        if let FileKind::Unknown = self.file {
            self.head.extend_from_slice(piece);
            if self.head.len() < 2 {
                return Ok(());
            }
            let head = std::mem::take(&mut self.head);
            self.decide(&head)?;
            return Ok(());
        }
        self.raw(piece)
    }

    fn decide(&mut self, head: &[u8]) -> Result<(), ImportError> {
        self.file = if is_gzip(head) {
            FileKind::Gzip(Box::new(GzipFile::new(
                self.gzip_limit(),
                self.keep_bytes,
                self.file_len,
            )))
        } else {
            FileKind::Plain
        };
        self.raw(head)
    }

    fn raw(&mut self, piece: &[u8]) -> Result<(), ImportError> {
        match &mut self.file {
            FileKind::Gzip(gzip) => gzip.feed(piece, &mut self.plain, self.window_step),
            _ => plain_feed(
                &mut self.plain,
                piece,
                Some(self.file_len).filter(|&n| n <= self.single_pass_max),
                self.file_len,
                self.window_step,
            ),
        }
    }

    /// The end of the file in this pass. `Ok(None)`: feed the file again from its first
    /// byte (a plain pickle's second pass); else the snapshot.
    pub fn end_of_input(&mut self) -> Result<Option<RawSnapshot>, ImportError> {
        self.end_of_input_with(&mut |_| true)
    }

    /// [`StreamDecoder::end_of_input`], reporting progress while it inflates a gzip file
    /// (`progress` returns false to cancel: [`ImportError::Cancelled`]).
    pub fn end_of_input_with(
        &mut self,
        progress: &mut dyn FnMut(Progress) -> bool,
    ) -> Result<Option<RawSnapshot>, ImportError> {
        if let FileKind::Unknown = self.file {
            let head = std::mem::take(&mut self.head);
            self.decide(&head)?;
        }
        if let FileKind::Gzip(gzip) = std::mem::replace(&mut self.file, FileKind::Plain) {
            return self.gzip_end(*gzip, progress).map(Some);
        }
        let r = plain_end(&mut self.plain)?;
        if r.is_none() {
            self.pass = 2;
            self.fed = 0;
        }
        Ok(r)
    }

    /// What a gzip file may inflate to: as [`super::import::decode_snapshot_with`] allows
    /// the file of the size the caller gave.
    fn gzip_limit(&self) -> u64 {
        let len = usize::try_from(self.file_len).unwrap_or(usize::MAX);
        self.options
            .max_decompressed_bytes
            .min(decompression_cap(len))
    }

    /// The end of a gzip file: its first pass ends (the file must have ended where a
    /// member does), and a pickle's second pass runs over what was kept for it.
    fn gzip_end(
        &mut self,
        gzip: GzipFile,
        progress: &mut dyn FnMut(Progress) -> bool,
    ) -> Result<RawSnapshot, ImportError> {
        gzip.gunzip.finish()?;
        if let Some(snap) = plain_end(&mut self.plain)? {
            return Ok(snap);
        }
        self.pass = 2;
        let limit = self.gzip_limit();
        let mut gzip = gzip;
        // The pickle's second pass, and at most once more ([`PickleStream::passes`]).
        for _ in 0..2 {
            gzip.second_pass(&mut self.plain, limit, self.window_step, progress)?;
            if let Some(snap) = plain_end(&mut self.plain)? {
                return Ok(snap);
            }
        }
        Err(ImportError::Format(
            "the decoder asked for a fourth pass over the file".into(),
        ))
    }
}

/// Feeds a plain file's `piece` to `plain`: a pickle of `single` bytes (a known size up
/// to the single pass's bound) is decoded in a single pass, one of `total` bytes (known)
/// or of a size known at its end (`None`: inflated as it is read) in two.
fn plain_feed(
    plain: &mut Plain,
    piece: &[u8],
    single: Option<u64>,
    total: impl Into<Option<u64>>,
    window_step: u64,
) -> Result<(), ImportError> {
    if let Plain::Unknown = plain {
        let Some(&first) = piece.first() else {
            return Ok(());
        };
        // As `decode_plain`: a pickle starts with PROTO, or (protocols 0 and 1) with
        // MARK, EMPTY_DICT or EMPTY_LIST; anything else is decoded whole.
        *plain = if matches!(first, 0x80 | b'(' | b'}' | b']') {
            Plain::Pickle(match single {
                Some(total) => PickleStream::single_pass(total, window_step),
                None => PickleStream::new(total.into(), window_step),
            })
        } else {
            Plain::Whole(Vec::new())
        };
    }
    match plain {
        Plain::Pickle(p) => p.feed(piece),
        Plain::Whole(bytes) => {
            bytes.extend_from_slice(piece);
            Ok(())
        }
        Plain::Unknown => Ok(()),
    }
}

fn plain_end(plain: &mut Plain) -> Result<Option<RawSnapshot>, ImportError> {
    match plain {
        Plain::Pickle(p) => p.end_pass(),
        Plain::Whole(bytes) => {
            let bytes = std::mem::take(bytes);
            decode_plain(&bytes).map(Some)
        }
        Plain::Unknown => decode_plain(&[]).map(Some),
    }
}

/// A streamed decode's answer when it is not a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The bytes are no snapshot (or the decode was cancelled).
    #[error(transparent)]
    Import(#[from] ImportError),
    /// The source could not be read.
    #[error("cannot read byte {offset}: {error}")]
    Read {
        offset: u64,
        #[source]
        error: std::io::Error,
    },
}

/// Decodes a large plain pickle file (64 MiB or more) with its second pass on several
/// threads, natively: `read_at` reads bytes of it at an offset (each thread its own),
/// `len` its size; `progress` as [`decode_from`]'s. `None` where it is not decoded this
/// way (a smaller or compressed file, wasm, a pickle this cannot cut exactly, bad input):
/// decode it with [`decode_from`], which reports as ever.
pub fn decode_file_parallel(
    read_at: &crate::snapshot::pickle::ReadAt<'_>,
    len: u64,
    progress: &mut dyn FnMut(Progress) -> bool,
) -> Option<Result<RawSnapshot, ImportError>> {
    let mut head = [0u8; 2];
    if len < 2 || read_at(0, &mut head).is_err() || head[0] != 0x80 {
        return None;
    }
    super::pickle::decode_file_parallel(read_at, len, &mut |pass, bytes_done| {
        progress(Progress {
            pass,
            passes: 2,
            bytes_done,
            bytes_total: len,
        })
    })
}

/// Decodes a snapshot from a source read in pieces of `piece_bytes`: `open` gives a
/// reader from its first byte (called once, or twice for a plain pickle), `len` its
/// size. `progress` is called after each piece (and while a gzip file inflates); it
/// returns false to cancel.
pub fn decode_from<R: Read>(
    open: &mut dyn FnMut() -> std::io::Result<R>,
    len: u64,
    options: DecodeOptions,
    piece_bytes: usize,
    progress: &mut dyn FnMut(Progress) -> bool,
) -> Result<RawSnapshot, StreamError> {
    let mut dec = StreamDecoder::new(len, options);
    let mut buf = vec![0u8; piece_bytes.max(1)];
    loop {
        let mut reader = open().map_err(|error| StreamError::Read { offset: 0, error })?;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    return Err(StreamError::Read {
                        offset: dec.progress().bytes_done,
                        error,
                    });
                }
            };
            dec.feed(buf.get(..n).unwrap_or(&[]))?;
            if !progress(dec.progress()) {
                return Err(ImportError::Cancelled.into());
            }
        }
        if let Some(snap) = dec.end_of_input_with(progress)? {
            return Ok(snap);
        }
    }
}
