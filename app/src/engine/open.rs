//! A snapshot file read in pieces (natively): the desktop app's File > Open, drop and
//! command line, and the CLI's FILE. The file is read [`PIECE_BYTES`] at a time (a plain
//! pickle twice, see core's `snapshot::stream`), so its bytes are never all in memory;
//! progress goes to a callback, which cancels by returning false.

use std::path::Path;

use allocsim_core::snapshot::RawSnapshot;
use allocsim_core::snapshot::import::{DecodeOptions, ImportError};
use allocsim_core::snapshot::stream::{Progress, StreamError, decode_from};

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
