//! Entry point of snapshot import: content detection (gzip, pickle, JSON), gunzip and limits.
//!
//! Formats are told apart by content, never by file name: gzip by its magic bytes
//! (`1f 8b`), a pickle by the `PROTO` opcode (`0x80`) it starts with, JSON by its first
//! non-space byte (`{`, or `[` for the legacy list-of-segments form).

pub use super::error::ImportError;
use super::gzip::Gunzip;
use super::{RawSnapshot, json, pickle};

/// Limits applied while importing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Gzip input is refused once it inflates beyond this many bytes, so that a small
    /// hostile file cannot exhaust memory.
    pub max_decompressed_bytes: u64,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        // 16 GiB where the address space allows it; wasm32 cannot hold more than 4 GiB.
        let max = if usize::BITS >= 64 {
            16 << 30
        } else {
            u64::from(u32::MAX)
        };
        DecodeOptions {
            max_decompressed_bytes: max,
        }
    }
}

/// Decodes a snapshot from the bytes of a file: gzip is detected by content, then a pickle
/// (protocol 2–5) or the same snapshot as JSON.
pub fn decode_snapshot(bytes: &[u8]) -> Result<RawSnapshot, ImportError> {
    decode_snapshot_with(bytes, &DecodeOptions::default())
}

/// [`decode_snapshot`] with explicit limits.
pub fn decode_snapshot_with(
    bytes: &[u8],
    options: &DecodeOptions,
) -> Result<RawSnapshot, ImportError> {
    if is_gzip(bytes) {
        let limit = options
            .max_decompressed_bytes
            .min(decompression_cap(bytes.len()));
        let plain = gunzip(bytes, limit)?;
        decode_plain(&plain)
    } else {
        decode_plain(bytes)
    }
}

/// How many times its compressed size a gzip snapshot may inflate to, beyond
/// [`DECOMPRESSED_FLOOR_BYTES`]: PyTorch's pickles compress 10–13:1 (the shared traces),
/// their JSON a few times more; a gzip bomb reaches 1032:1.
pub const DECOMPRESSION_RATIO: u64 = 128;
/// What any gzip snapshot may inflate to, whatever its compressed size.
pub const DECOMPRESSED_FLOOR_BYTES: u64 = 256 << 20;

/// The decompressed size a gzip file of `compressed` bytes may reach: 128 times its size,
/// at least 256 MiB (then [`DecodeOptions::max_decompressed_bytes`] bounds it).
#[must_use]
pub fn decompression_cap(compressed: usize) -> u64 {
    (compressed as u64)
        .saturating_mul(DECOMPRESSION_RATIO)
        .max(DECOMPRESSED_FLOOR_BYTES)
}

/// Whether `bytes` start with the gzip magic number.
#[must_use]
pub fn is_gzip(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0x1f, 0x8b])
}

/// The pieces [`gunzip`] inflates in before it appends them to its answer.
const GUNZIP_PIECE_BYTES: usize = 1 << 20;

/// Inflates a gzip stream (several concatenated members allowed, and trailing zero
/// padding after the last, as Python's `gzip` accepts), refusing to produce more than
/// `limit_bytes`.
pub fn gunzip(bytes: &[u8], limit_bytes: u64) -> Result<Vec<u8>, ImportError> {
    // Pre-size from the trailer's ISIZE, but never beyond what deflate can reach from
    // this many compressed bytes (≈1032:1) or the limit: the trailer is untrusted.
    let isize_hint = bytes
        .len()
        .checked_sub(4)
        .and_then(|at| bytes.get(at..))
        .and_then(|t| <[u8; 4]>::try_from(t).ok())
        .map_or(0, |t| u64::from(u32::from_le_bytes(t)));
    let reachable = (bytes.len() as u64).saturating_mul(1032);
    let hint = isize_hint.min(reachable).min(limit_bytes).min(1 << 32);
    let mut out = Vec::with_capacity(usize::try_from(hint).unwrap_or(0));
    gunzip_pieces(bytes, limit_bytes, GUNZIP_PIECE_BYTES, &mut |piece, _| {
        out.extend_from_slice(piece);
        Ok(())
    })?;
    Ok(out)
}

/// Takes inflated pieces (and how many compressed bytes were read so far).
pub type PieceSink<'a> = dyn FnMut(&[u8], u64) -> Result<(), ImportError> + 'a;

/// The first buffer [`gunzip_pieces`] inflates into; it doubles, up to the pieces asked
/// for, as it fills, so that a small file costs no big buffer.
const FIRST_PIECE_BYTES: usize = 64 << 10;

/// [`gunzip`] handing the inflated bytes to `sink` in pieces of at most `piece_bytes`
/// (with how many compressed bytes were read so far), never holding more of them. The
/// bytes it inflated to.
pub fn gunzip_pieces(
    bytes: &[u8],
    limit_bytes: u64,
    piece_bytes: usize,
    sink: &mut PieceSink<'_>,
) -> Result<u64, ImportError> {
    let piece_bytes = piece_bytes.max(1);
    let mut gz = Gunzip::new(limit_bytes);
    let mut buf = vec![0u8; piece_bytes.min(FIRST_PIECE_BYTES)];
    let mut filled = 0;
    let mut rest = bytes;
    loop {
        let (read, written) = gz.inflate(rest, buf.get_mut(filled..).unwrap_or(&mut []))?;
        rest = rest.get(read..).unwrap_or(&[]);
        filled += written;
        let stuck = read == 0 && written == 0;
        if filled == buf.len() || (stuck && filled > 0) {
            sink(buf.get(..filled).unwrap_or(&[]), gz.read_bytes())?;
            if filled == buf.len() && buf.len() < piece_bytes {
                buf.resize(buf.len().saturating_mul(2).min(piece_bytes), 0);
            }
            filled = 0;
        }
        if stuck {
            break;
        }
    }
    gz.finish()
}

/// Decodes an uncompressed snapshot (pickle or JSON).
pub fn decode_plain(bytes: &[u8]) -> Result<RawSnapshot, ImportError> {
    let Some(&first) = bytes.first() else {
        return Err(ImportError::Format("the file is empty".into()));
    };
    if first == 0x80 {
        return pickle::decode_snapshot_pickle(bytes);
    }
    if is_gzip(bytes) {
        return Err(ImportError::Format(
            "the decompressed file is gzip again (compressed twice): gunzip it once and open that"
                .into(),
        ));
    }
    // A UTF-8 byte-order mark before JSON is allowed (JSON's byte offsets then count
    // from after it).
    let body = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{' | b'[') => json::decode_snapshot_json(body),
        // Protocol 0 and 1 pickles have no PROTO opcode; a snapshot would start with
        // MARK (`(dp0`) or EMPTY_DICT.
        _ if matches!(first, b'(' | b'}' | b']') => pickle::decode_snapshot_pickle(bytes),
        None => Err(ImportError::Format("the file holds only whitespace".into())),
        Some(_) => Err(ImportError::Format(format!(
            "starts with {}, expected gzip (1f 8b), a pickle (80) or JSON ({{)",
            hex_prefix(bytes)
        ))),
    }
}

fn hex_prefix(bytes: &[u8]) -> String {
    bytes
        .iter()
        .take(4)
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gz(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    const SNAPSHOT: &[u8] = br#"{"segments": [], "device_traces": [[]]}"#;

    #[test]
    fn json_with_a_byte_order_mark_decodes() {
        let mut bom = b"\xef\xbb\xbf".to_vec();
        bom.extend_from_slice(SNAPSHOT);
        assert!(decode_snapshot(&bom).is_ok());
    }

    #[test]
    fn gzip_with_trailing_zero_padding_decodes_and_other_trailing_bytes_are_named() {
        let mut padded = gz(SNAPSHOT);
        padded.extend_from_slice(&[0; 512]);
        assert!(decode_snapshot(&padded).is_ok());
        let mut two = gz(&SNAPSHOT[..10]);
        two.extend_from_slice(&gz(&SNAPSHOT[10..]));
        assert!(decode_snapshot(&two).is_ok(), "concatenated members");
        let mut junk = gz(SNAPSHOT);
        let at = junk.len();
        junk.extend_from_slice(b"junk");
        let e = decode_snapshot(&junk).unwrap_err().to_string();
        assert!(
            e.contains(&format!("4 bytes after the gzip stream at byte {at}")),
            "{e}"
        );
    }

    #[test]
    fn gzip_inside_gzip_says_so() {
        let e = decode_snapshot(&gz(&gz(SNAPSHOT))).unwrap_err().to_string();
        assert!(e.contains("compressed twice"), "{e}");
    }

    #[test]
    fn the_decompression_limit_holds_across_members() {
        let mut two = gz(&[b' '; 600]);
        two.extend_from_slice(&gz(&[b' '; 600]));
        let opts = DecodeOptions {
            max_decompressed_bytes: 1000,
        };
        assert!(matches!(
            decode_snapshot_with(&two, &opts),
            Err(ImportError::TooLarge { limit_bytes: 1000 })
        ));
    }
}
