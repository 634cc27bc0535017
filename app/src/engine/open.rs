//! A snapshot file read in pieces (natively): the desktop app's File > Open, drop and
//! command line, and the CLI's FILE. The file is read [`PIECE_BYTES`] at a time (a plain
//! pickle twice, see core's `snapshot::stream`), so its bytes are never all in memory;
//! progress goes to a callback, which cancels by returning false.

use std::path::Path;

use allocsim_core::snapshot::RawSnapshot;
use allocsim_core::snapshot::import::{DecodeOptions, ImportError};
use allocsim_core::snapshot::stream::{Progress, StreamError, decode_from};

use super::wire::Response;

/// The file is read this many bytes at a time.
pub const PIECE_BYTES: usize = 4 << 20;

/// Why a file did not decode.
#[derive(Debug)]
pub enum OpenError {
    /// The progress callback asked to stop.
    Cancelled,
    /// One line naming the file: it cannot be read, or is no snapshot (with the byte
    /// offset in the whole file).
    Failed(String),
}

/// Decodes the snapshot at `path`, read in pieces.
pub fn decode_file(
    path: &Path,
    progress: &mut dyn FnMut(Progress) -> bool,
) -> Result<RawSnapshot, OpenError> {
    let shown = path.display();
    let len = std::fs::metadata(path)
        .map_err(|e| OpenError::Failed(format!("{shown}: cannot read: {e}")))?
        .len();
    let mut open = || std::fs::File::open(path);
    match decode_from(
        &mut open,
        len,
        DecodeOptions::default(),
        PIECE_BYTES,
        progress,
    ) {
        Ok(snap) => Ok(snap),
        Err(StreamError::Import(ImportError::Cancelled)) => Err(OpenError::Cancelled),
        Err(StreamError::Read { offset: 0, error }) => {
            Err(OpenError::Failed(format!("{shown}: cannot read: {error}")))
        }
        Err(e @ StreamError::Read { .. }) => Err(OpenError::Failed(format!("{shown}: {e}"))),
        Err(StreamError::Import(e)) => Err(OpenError::Failed(format!("{shown}: {e}"))),
    }
}

/// The decode's progress as the engine's [`Response::Progress`], at most every half
/// percent: the share of the whole open (the decode is its first half).
#[derive(Debug)]
pub struct ProgressReport {
    job: u64,
    name: String,
    shown: f32,
}

impl ProgressReport {
    #[must_use]
    pub fn new(job: u64, name: &str) -> ProgressReport {
        ProgressReport {
            job,
            name: name.to_string(),
            shown: -1.0,
        }
    }

    pub fn report(&mut self, p: Progress, emit: &mut dyn FnMut(Response)) {
        let fraction = 0.05 + 0.45 * p.fraction();
        if fraction - self.shown >= 0.005 {
            self.shown = fraction;
            emit(Response::Progress {
                job: self.job,
                stage: format!("reading {} ({} of 2)", self.name, p.pass),
                fraction,
            });
        }
    }
}

/// What one wasm instance of the browser's app holds at its peak while it opens a snapshot
/// of `plain_bytes` (uncompressed), as a multiple of that size. The engine's worker and the
/// page each have a memory of their own, and neither is ever given back. Measured in
/// headless Chromium on the 1.12 GB generated snapshot (`web/tests/bench.mjs`, which reads
/// both memories after the open): the worker 2,223 MiB (2.07× the file: the decode's
/// high-water mark, 1,583 MiB, then two replays), the page 2,210 MiB (2.06×: the ops table,
/// the recorded timeline, the replays' views, the bands). With a margin: 2.5, so files up
/// to 1.7 GB are tried. A frame-less snapshot costs more per byte (the 1 M-event synthetic's
/// decode peaks at 2.9× its 74.5 MB), so one near that size may still run out: its worker
/// then stops and the open fails with a message (`worker.js`), never a hang.
pub const PEAK_MEMORY_PER_BYTE: f64 = 2.5;

/// Where a WebAssembly engine cannot open a snapshot (its memory ends at 4 GiB): the
/// one-line message to show before starting, or `None`. `plain_bytes`: the file's size,
/// or for gzip the size its trailer states (at least 8 times the compressed size, what
/// PyTorch's pickles inflate to at the least).
#[must_use]
pub fn too_big_for_wasm(name: &str, plain_bytes: u64) -> Option<String> {
    const WASM_MEMORY: f64 = 4.0 * (1u64 << 30) as f64;
    let need = plain_bytes as f64 * PEAK_MEMORY_PER_BYTE;
    (need > WASM_MEMORY).then(|| {
        format!(
            "{name}: {:.1} GB of snapshot needs about {:.1} GB of memory to open, more than the \
             4 GiB a browser gives WebAssembly: open it in the desktop app (allocsim open FILE)",
            plain_bytes as f64 / 1e9,
            need / 1e9
        )
    })
}
