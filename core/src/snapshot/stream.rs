//! A snapshot decoded from its file read in pieces, so that no caller holds the whole
//! file: the desktop app's engine thread, the browser's worker (slices of a `File`), the
//! CLI. Formats are told apart as [`super::import::decode_snapshot`] does, with the same
//! limits, answers and errors:
//! - **a pickle** is read twice ([`super::pickle::PickleStream`]): the pre-pass, then
//!   the machine over windows of the input; nothing of the file is held but the window;
//! - **gzip** is kept compressed (PyTorch's pickles compress 10–13:1) and inflated twice
//!   from memory, in pieces, under the same cap on what it may inflate to: its file is
//!   read once;
//! - **JSON** (and anything else: its error) is collected whole and decoded at the end.
//!
//! [`StreamDecoder`] is fed by whoever reads ([`StreamDecoder::feed`], then
//! [`StreamDecoder::end_of_input`], which may ask for the file again from its start);
//! [`decode_from`] drives it over any re-readable source with progress and cancel.

use std::io::Read;

use super::RawSnapshot;
use super::error::ImportError;
use super::import::{DecodeOptions, decode_plain, decompression_cap, gunzip_pieces, is_gzip};
use super::pickle::{PickleStream, WINDOW_STEP};

/// How far a streamed decode is: the pass over the file (1 or 2; a gzip file is read in
/// pass 1 and inflated in both from memory) and the bytes of the file it has been through
/// in this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub pass: u8,
    pub bytes_done: u64,
    pub bytes_total: u64,
}

impl Progress {
    /// The share of the work done, 0 to 1 (each pass half of it).
    #[must_use]
    pub fn fraction(&self) -> f32 {
        let within = if self.bytes_total == 0 {
            1.0
        } else {
            (self.bytes_done as f64 / self.bytes_total as f64).min(1.0)
        };
        f64::midpoint(f64::from(self.pass.saturating_sub(1)), within) as f32
    }
}

/// Inflated bytes are handed on in pieces of this size.
const GZIP_PIECE: usize = 4 << 20;

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
    /// Gzip: the compressed file, kept whole.
    Gzip(Vec<u8>),
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
        }
    }

    /// The machine runs over windows of about `bytes` (tests: many windows on a small
    /// file).
    #[must_use]
    pub fn with_window_step(mut self, bytes: u64) -> StreamDecoder {
        self.window_step = bytes;
        self
    }

    /// The pass the next bytes belong to (1, or 2 once [`StreamDecoder::end_of_input`]
    /// asked for the file again).
    #[must_use]
    pub fn pass(&self) -> u8 {
        self.pass
    }

    /// The progress after the bytes fed so far.
    #[must_use]
    pub fn progress(&self) -> Progress {
        Progress {
            pass: self.pass,
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
            FileKind::Gzip(Vec::with_capacity(
                usize::try_from(self.file_len.min(1 << 32)).unwrap_or(0),
            ))
        } else {
            FileKind::Plain
        };
        self.raw(head)
    }

    fn raw(&mut self, piece: &[u8]) -> Result<(), ImportError> {
        match &mut self.file {
            FileKind::Gzip(compressed) => {
                compressed.extend_from_slice(piece);
                Ok(())
            }
            _ => plain_feed(
                &mut self.plain,
                piece,
                Some(self.file_len),
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
        if let FileKind::Gzip(compressed) = std::mem::replace(&mut self.file, FileKind::Plain) {
            let r = self.inflated(&compressed, progress);
            self.file = FileKind::Gzip(compressed);
            return r.map(Some);
        }
        let r = plain_end(&mut self.plain)?;
        if r.is_none() {
            self.pass = 2;
            self.fed = 0;
        }
        Ok(r)
    }

    /// Decodes the kept gzip file: inflated once per pass, in pieces.
    fn inflated(
        &mut self,
        compressed: &[u8],
        progress: &mut dyn FnMut(Progress) -> bool,
    ) -> Result<RawSnapshot, ImportError> {
        let limit = self
            .options
            .max_decompressed_bytes
            .min(decompression_cap(compressed.len()));
        let total = compressed.len() as u64;
        loop {
            let pass = self.pass;
            let plain = &mut self.plain;
            let step = self.window_step;
            gunzip_pieces(compressed, limit, GZIP_PIECE, &mut |piece, read| {
                let p = Progress {
                    pass,
                    bytes_done: read,
                    bytes_total: total,
                };
                if !progress(p) {
                    return Err(ImportError::Cancelled);
                }
                plain_feed(plain, piece, None, step)
            })?;
            match plain_end(&mut self.plain)? {
                Some(snap) => return Ok(snap),
                None => self.pass = 2,
            }
        }
    }
}

fn plain_feed(
    plain: &mut Plain,
    piece: &[u8],
    total: Option<u64>,
    window_step: u64,
) -> Result<(), ImportError> {
    if let Plain::Unknown = plain {
        let Some(&first) = piece.first() else {
            return Ok(());
        };
        // As `decode_plain`: a pickle starts with PROTO, or (protocols 0 and 1) with
        // MARK, EMPTY_DICT or EMPTY_LIST; anything else is decoded whole.
        *plain = if matches!(first, 0x80 | b'(' | b'}' | b']') {
            Plain::Pickle(PickleStream::new(total, window_step))
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
