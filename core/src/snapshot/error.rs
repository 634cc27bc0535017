//! Why a snapshot could not be imported: the one error type of the decoders.

/// Why a snapshot could not be imported. Every variant says where (byte offset in the
/// uncompressed stream) when a position applies; `Display` is always one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImportError {
    /// Neither gzip, a pickle nor JSON, or an empty file.
    #[error("not a PyTorch snapshot: {0}")]
    Format(String),
    /// The gzip stream is corrupt or truncated.
    #[error("gzip: {message} (after {decompressed_bytes} decompressed bytes)")]
    Gzip {
        message: String,
        /// How far decompression got before the failure.
        decompressed_bytes: u64,
    },
    /// The decompressed stream is larger than [`super::import::DecodeOptions::max_decompressed_bytes`].
    #[error(
        "decompressed snapshot exceeds the limit of {limit_bytes} bytes (a gzip file may inflate to 128 times its size, at least 256 MiB: a decompression bomb?)"
    )]
    TooLarge { limit_bytes: u64 },
    /// An opcode that would make the unpickler import or call code; never executed.
    #[error("byte {offset}: refused pickle opcode {name} ({reason})")]
    RefusedOpcode {
        offset: u64,
        name: &'static str,
        reason: &'static str,
    },
    /// A byte that is no pickle opcode at all.
    #[error("byte {offset}: unknown pickle opcode 0x{byte:02x}")]
    UnknownOpcode { offset: u64, byte: u8 },
    /// The stream ends inside an opcode (or before `STOP`).
    #[error("byte {offset}: truncated pickle ({what} needs {missing_bytes} more bytes)")]
    Truncated {
        /// Where the opcode that needs the missing bytes starts.
        offset: u64,
        /// The opcode (or "next opcode" when the stream ends without `STOP`).
        what: &'static str,
        missing_bytes: u64,
    },
    /// A well-formed opcode used in a way the pickle machine cannot follow (stack
    /// underflow, `APPEND` onto a dict, a memo index never stored, …).
    #[error("byte {offset}: malformed pickle: {message}")]
    Malformed { offset: u64, message: String },
    /// The pickle (or JSON) is valid but is not a snapshot: a missing key, a wrong type,
    /// a negative size.
    #[error("byte {offset}: {location}: {problem}")]
    Schema {
        /// Offset of the object (dict, list) that holds the problem.
        offset: u64,
        /// Where in the snapshot, e.g. `device_traces[0][17]` or `segments[3].blocks[2]`.
        location: String,
        problem: String,
    },
    /// A streamed decode stopped because its caller asked it to (the app's Cancel).
    #[error("cancelled")]
    Cancelled,
    /// Invalid JSON or a JSON snapshot of the wrong shape.
    #[error("byte {offset} (line {line}, column {column}): {message}")]
    Json {
        offset: u64,
        line: usize,
        column: usize,
        message: String,
    },
}
