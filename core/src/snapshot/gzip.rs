//! Gzip inflated as its bytes arrive ([`Gunzip`]): the one gunzip of snapshot import.
//! [`super::import::gunzip_pieces`] feeds it a whole file, the streamed decode
//! ([`super::stream`]) each piece as it is read, so both accept and refuse the same files
//! with the same errors: several members concatenated and zero padding after the last (as
//! Python's `gzip` accepts), each member's checksum and size checked, and a cap on what it
//! may inflate to, so that a small hostile file (a gzip bomb) cannot exhaust memory.
//!
//! It is pushed the compressed bytes and inflates into the caller's buffer, so that the
//! caller decides where the inflated bytes go (a buffer reused piece after piece, or the
//! streamed decode's kept bytes, written once, in place).

use flate2::{Crc, Decompress, FlushDecompress, Status};

use super::error::ImportError;

/// The flags of a member's header (RFC 1952, 2.3.1).
const FHCRC: u8 = 1 << 1;
const FEXTRA: u8 = 1 << 2;
const FNAME: u8 = 1 << 3;
const FCOMMENT: u8 = 1 << 4;
/// Must be zero (a decoder "must give an error indication if any reserved bit is
/// non-zero").
const FRESERVED: u8 = 0xe0;

/// Inflates a gzip file pushed to it in pieces ([`Gunzip::inflate`], then
/// [`Gunzip::finish`] at its end).
#[derive(Debug)]
pub struct Gunzip {
    part: Part,
    /// The deflate data of the member being read (reset for each member).
    inflate: Decompress,
    /// The CRC-32 and size (mod 2³²) of the member's inflated bytes, as its trailer states
    /// them.
    crc: Crc,
    /// Inflating beyond this many bytes (all members) is refused.
    limit_bytes: u64,
    /// Compressed bytes consumed.
    read_bytes: u64,
    /// Bytes inflated, all members.
    inflated_bytes: u64,
    /// Where the last complete member ended: bytes after it are another member or zero
    /// padding.
    ended_at: u64,
}

/// Where the next compressed byte belongs.
#[derive(Debug)]
enum Part {
    Header(Box<Header>),
    Deflate,
    /// A member's trailer: its CRC-32 and size, little-endian, and how many of its 8 bytes
    /// were read.
    Trailer([u8; 8], usize),
    /// After a member: another member, zero padding, or the end.
    Between,
    /// Zero padding after the last member, to the end.
    Padding,
    /// Bytes after the last member that are neither another member nor padding: refused
    /// at the end, whose offset the message counts them to (as it always did).
    Junk,
}

/// A member's header, read byte by byte as it arrives (it is short; its optional name and
/// comment end at a NUL, so its length is known only once read).
#[derive(Debug)]
struct Header {
    field: Field,
    /// The fixed part (10 bytes), or `XLEN` or the header's CRC-16 (2).
    bytes: [u8; 10],
    /// Bytes of `bytes` read for the current field.
    got: usize,
    flags: u8,
    /// Bytes of the extra field still to skip.
    extra_left: usize,
    /// The CRC-32 of the header so far (its low 16 bits are `FHCRC`'s check).
    crc: Crc,
    /// Whether this is the file's first member (a later one whose magic is wrong is
    /// trailing junk, as the whole-file gunzip always said).
    first: bool,
}

/// The fields of a header, in file order; all but `Fixed` optional.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Field {
    Fixed,
    ExtraLen,
    Extra,
    Name,
    Comment,
    HeaderCrc,
    Done,
}

/// Why a header is refused.
enum BadHeader {
    /// The first two bytes are not gzip's magic (`1f 8b`).
    NotGzip,
    Invalid(&'static str),
}

impl Header {
    fn new(first: bool) -> Header {
        Header {
            field: Field::Fixed,
            bytes: [0; 10],
            got: 0,
            flags: 0,
            extra_left: 0,
            crc: Crc::new(),
            first,
        }
    }

    /// The field after `self.field` that this header has.
    fn next_field(&self) -> Field {
        let has = |f: Field| match f {
            Field::ExtraLen | Field::Extra => self.flags & FEXTRA != 0,
            Field::Name => self.flags & FNAME != 0,
            Field::Comment => self.flags & FCOMMENT != 0,
            Field::HeaderCrc => self.flags & FHCRC != 0,
            Field::Fixed | Field::Done => true,
        };
        [
            Field::ExtraLen,
            Field::Name,
            Field::Comment,
            Field::HeaderCrc,
            Field::Done,
        ]
        .into_iter()
        .find(|&f| f > self.field && has(f))
        .unwrap_or(Field::Done)
    }

    /// Reads `input` into a field of `n` bytes; whether it is complete.
    fn fill(&mut self, input: &[u8], used: &mut usize, n: usize) -> bool {
        let take = (n - self.got).min(input.len());
        if let (Some(to), Some(from)) = (
            self.bytes.get_mut(self.got..self.got + take),
            input.get(..take),
        ) {
            to.copy_from_slice(from);
        }
        self.got += take;
        *used += take;
        self.got == n
    }

    /// Reads the header from `input`: the bytes it took, and whether the header is over.
    fn read(&mut self, input: &[u8]) -> Result<(usize, bool), BadHeader> {
        let mut used = 0;
        while self.field != Field::Done {
            let rest = input.get(used..).unwrap_or(&[]);
            if rest.is_empty() {
                return Ok((used, false));
            }
            match self.field {
                Field::Fixed => {
                    // The magic is checked as soon as it is there: what follows a member
                    // may be junk, told apart by its first two bytes.
                    let complete = self.fill(rest, &mut used, 10);
                    if self.got >= 2 && self.bytes[..2] != [0x1f, 0x8b] {
                        return Err(BadHeader::NotGzip);
                    }
                    if !complete {
                        return Ok((used, false));
                    }
                    if self.bytes[2] != 8 {
                        return Err(BadHeader::Invalid("compression method is not deflate"));
                    }
                    self.flags = self.bytes[3];
                    if self.flags & FRESERVED != 0 {
                        return Err(BadHeader::Invalid("reserved flag bits are set"));
                    }
                    self.crc.update(&self.bytes);
                }
                Field::ExtraLen => {
                    if !self.fill(rest, &mut used, 2) {
                        return Ok((used, false));
                    }
                    self.crc.update(&self.bytes[..2]);
                    self.extra_left =
                        usize::from(u16::from_le_bytes([self.bytes[0], self.bytes[1]]));
                }
                Field::Extra => {
                    let take = self.extra_left.min(rest.len());
                    self.crc.update(rest.get(..take).unwrap_or(&[]));
                    self.extra_left -= take;
                    used += take;
                    if self.extra_left > 0 {
                        return Ok((used, false));
                    }
                }
                Field::Name | Field::Comment => {
                    let Some(nul) = rest.iter().position(|&b| b == 0) else {
                        self.crc.update(rest);
                        return Ok((input.len(), false));
                    };
                    self.crc.update(rest.get(..=nul).unwrap_or(&[]));
                    used += nul + 1;
                }
                Field::HeaderCrc => {
                    if !self.fill(rest, &mut used, 2) {
                        return Ok((used, false));
                    }
                    let stated = u16::from_le_bytes([self.bytes[0], self.bytes[1]]);
                    if u32::from(stated) != self.crc.sum() & 0xffff {
                        return Err(BadHeader::Invalid("header checksum does not match"));
                    }
                }
                Field::Done => {}
            }
            self.field = if self.field == Field::ExtraLen {
                Field::Extra
            } else {
                self.next_field()
            };
            self.got = 0;
        }
        Ok((used, true))
    }
}

impl Gunzip {
    /// A gunzip that refuses to inflate to more than `limit_bytes`
    /// ([`ImportError::TooLarge`]).
    #[must_use]
    pub fn new(limit_bytes: u64) -> Gunzip {
        Gunzip {
            part: Part::Header(Box::new(Header::new(true))),
            inflate: Decompress::new(false),
            crc: Crc::new(),
            limit_bytes,
            read_bytes: 0,
            inflated_bytes: 0,
            ended_at: 0,
        }
    }

    /// Compressed bytes consumed so far.
    #[must_use]
    pub fn read_bytes(&self) -> u64 {
        self.read_bytes
    }

    /// Bytes inflated so far (all members).
    #[must_use]
    pub fn inflated_bytes(&self) -> u64 {
        self.inflated_bytes
    }

    fn error(&self, message: String) -> ImportError {
        ImportError::Gzip {
            message,
            decompressed_bytes: self.inflated_bytes,
        }
    }

    /// Inflates the next bytes of the file, `input`, into `out`: the bytes of `input`
    /// consumed and of `out` written. It stops once `out` is full or nothing more can be
    /// inflated from `input`: call it again with the rest of `input` (and a buffer with
    /// room) until it consumes and writes nothing, then with the next piece.
    pub fn inflate(&mut self, input: &[u8], out: &mut [u8]) -> Result<(usize, usize), ImportError> {
        let mut used = 0usize;
        let mut written = 0usize;
        loop {
            let rest = input.get(used..).unwrap_or(&[]);
            let at = self.read_bytes + used as u64;
            match &mut self.part {
                Part::Header(header) => {
                    let first = header.first;
                    match header.read(rest) {
                        Ok((n, done)) => {
                            used += n;
                            if !done {
                                break;
                            }
                            self.inflate.reset(false);
                            self.crc.reset();
                            self.part = Part::Deflate;
                        }
                        Err(BadHeader::NotGzip) if !first => {
                            self.part = Part::Junk;
                        }
                        Err(BadHeader::NotGzip) => {
                            return Err(
                                self.error("not gzip: the file does not start with 1f 8b".into())
                            );
                        }
                        Err(BadHeader::Invalid(why)) => {
                            return Err(
                                self.error(format!("invalid gzip header before byte {at}: {why}"))
                            );
                        }
                    }
                }
                Part::Deflate => {
                    // One byte past the limit tells "exactly at the limit" from "beyond it".
                    let room = self
                        .limit_bytes
                        .saturating_add(1)
                        .saturating_sub(self.inflated_bytes);
                    let to = out
                        .len()
                        .min(written.saturating_add(usize::try_from(room).unwrap_or(usize::MAX)));
                    let Some(buf) = out.get_mut(written..to) else {
                        break;
                    };
                    let (in_before, out_before) =
                        (self.inflate.total_in(), self.inflate.total_out());
                    let status = self
                        .inflate
                        .decompress(rest, buf, FlushDecompress::None)
                        .map_err(|e| {
                            self.error(format!("corrupt deflate data before byte {at}: {e}"))
                        })?;
                    let n_in = usize::try_from(self.inflate.total_in() - in_before).unwrap_or(0);
                    let n_out = usize::try_from(self.inflate.total_out() - out_before).unwrap_or(0);
                    self.crc.update(buf.get(..n_out).unwrap_or(&[]));
                    used += n_in;
                    written += n_out;
                    self.inflated_bytes += n_out as u64;
                    if self.inflated_bytes > self.limit_bytes {
                        return Err(ImportError::TooLarge {
                            limit_bytes: self.limit_bytes,
                        });
                    }
                    if status == Status::StreamEnd {
                        self.part = Part::Trailer([0; 8], 0);
                    } else if n_in == 0 && n_out == 0 {
                        break;
                    }
                }
                Part::Trailer(bytes, got) => {
                    let take = (8 - *got).min(rest.len());
                    if let (Some(to), Some(from)) =
                        (bytes.get_mut(*got..*got + take), rest.get(..take))
                    {
                        to.copy_from_slice(from);
                    }
                    *got += take;
                    used += take;
                    if *got < 8 {
                        break;
                    }
                    let [c0, c1, c2, c3, s0, s1, s2, s3] = *bytes;
                    if u32::from_le_bytes([c0, c1, c2, c3]) != self.crc.sum() {
                        return Err(self.error(format!(
                            "the member ending at byte {} is corrupt: its CRC-32 does not match",
                            at + take as u64
                        )));
                    }
                    if u32::from_le_bytes([s0, s1, s2, s3]) != self.crc.amount() {
                        return Err(self.error(format!(
                            "the member ending at byte {} is corrupt: its size does not match",
                            at + take as u64
                        )));
                    }
                    self.ended_at = at + take as u64;
                    self.part = Part::Between;
                }
                Part::Between => match rest.first() {
                    None => break,
                    Some(0) => self.part = Part::Padding,
                    Some(_) => self.part = Part::Header(Box::new(Header::new(false))),
                },
                Part::Padding => match rest.iter().position(|&b| b != 0) {
                    None => {
                        used = input.len();
                        break;
                    }
                    Some(i) => {
                        used += i;
                        self.part = Part::Junk;
                    }
                },
                Part::Junk => {
                    used = input.len();
                    break;
                }
            }
        }
        self.read_bytes += used as u64;
        Ok((used, written))
    }

    /// The end of the file: the bytes it inflated to, or why the file is refused (it ends
    /// inside a member, or has bytes after the last that are neither another member nor
    /// zero padding).
    pub fn finish(&self) -> Result<u64, ImportError> {
        match &self.part {
            Part::Between | Part::Padding => Ok(self.inflated_bytes),
            Part::Junk => Err(self.error(format!(
                "{} bytes after the gzip stream at byte {} are neither another gzip member nor zero padding",
                self.read_bytes - self.ended_at,
                self.ended_at
            ))),
            Part::Header(_) | Part::Deflate | Part::Trailer(..) => Err(self.error(format!(
                "truncated: the file ends inside a gzip member, at byte {}",
                self.read_bytes
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    /// A member of `plain` with every optional header field (extra, name, comment and the
    /// header's CRC-16), written by hand: flate2's encoder writes no header CRC.
    fn member_with_every_field(plain: &[u8]) -> Vec<u8> {
        let mut out = vec![
            0x1f,
            0x8b,
            8,
            FHCRC | FEXTRA | FNAME | FCOMMENT,
            1,
            2,
            3,
            4,
            0,
            3,
        ];
        out.extend_from_slice(&5u16.to_le_bytes());
        out.extend_from_slice(b"extra");
        out.extend_from_slice(b"snapshot.pickle\0a comment\0");
        let mut crc = Crc::new();
        crc.update(&out);
        out.extend_from_slice(&(crc.sum() as u16).to_le_bytes());
        let mut e = flate2::write::DeflateEncoder::new(out, flate2::Compression::default());
        e.write_all(plain).expect("write");
        let mut out = e.finish().expect("deflate");
        let mut crc = Crc::new();
        crc.update(plain);
        out.extend_from_slice(&crc.sum().to_le_bytes());
        out.extend_from_slice(&crc.amount().to_le_bytes());
        out
    }

    /// Inflates `bytes` fed in pieces of `piece` into buffers of `out` bytes.
    fn inflated(bytes: &[u8], piece: usize, out: usize) -> Result<Vec<u8>, ImportError> {
        let mut gz = Gunzip::new(1 << 30);
        let mut all = Vec::new();
        let mut buf = vec![0; out];
        for mut p in bytes.chunks(piece) {
            loop {
                let (read, written) = gz.inflate(p, &mut buf)?;
                all.extend_from_slice(&buf[..written]);
                p = &p[read..];
                if read == 0 && written == 0 {
                    break;
                }
            }
        }
        assert_eq!(gz.finish()?, all.len() as u64);
        assert_eq!(gz.read_bytes(), bytes.len() as u64);
        Ok(all)
    }

    fn text() -> Vec<u8> {
        (0..50_000u32)
            .flat_map(|i| (i % 1000).to_le_bytes())
            .collect()
    }

    #[test]
    fn every_header_field_is_read_in_pieces_of_any_size_into_buffers_of_any_size() {
        let plain = text();
        let mut two = member_with_every_field(&plain[..1000]);
        two.extend_from_slice(&member_with_every_field(&plain[1000..]));
        for piece in [1, 2, 7, 4096, two.len()] {
            for out in [1, 3, 1 << 16] {
                assert_eq!(
                    inflated(&two, piece, out).expect("inflates"),
                    plain,
                    "{piece} {out}"
                );
            }
        }
    }

    #[test]
    fn damaged_headers_and_trailers_are_named() {
        let good = member_with_every_field(b"some bytes");
        let fails = |at: usize, byte: u8| {
            let mut bad = good.clone();
            bad[at] ^= byte;
            inflated(&bad, 3, 5).expect_err("refused").to_string()
        };
        assert!(fails(0, 1).contains("not gzip"));
        assert!(fails(2, 1).contains("not deflate"));
        assert!(fails(3, 0x20).contains("reserved flag"));
        assert!(fails(20, 1).contains("header checksum"));
        let len = good.len();
        assert!(fails(len - 8, 1).contains("CRC-32 does not match"));
        assert!(fails(len - 4, 1).contains("size does not match"));
        for cut in [1, 10, 12, 30, len - 8, len - 1] {
            let e = inflated(&good[..cut], 4, 64)
                .expect_err("truncated")
                .to_string();
            assert!(e.contains("truncated"), "cut at {cut}: {e}");
        }
    }

    #[test]
    fn padding_then_anything_is_junk_counted_to_the_end() {
        let mut bytes = member_with_every_field(b"some bytes");
        let end = bytes.len();
        bytes.extend_from_slice(&[0, 0, 0x1f, 0x8b, 1]);
        let e = inflated(&bytes, 2, 64).expect_err("junk").to_string();
        assert!(
            e.contains(&format!("5 bytes after the gzip stream at byte {end}")),
            "{e}"
        );
        bytes.truncate(end + 1);
        bytes.push(0x8b);
        let e = inflated(&bytes, 1, 64).expect_err("junk").to_string();
        assert!(
            e.contains(&format!("2 bytes after the gzip stream at byte {end}")),
            "{e}"
        );
    }

    #[test]
    fn the_limit_is_exact() {
        let plain = text();
        let gz = member_with_every_field(&plain);
        let mut buf = vec![0; 1 << 20];
        let mut at_limit = Gunzip::new(plain.len() as u64);
        assert_eq!(
            at_limit.inflate(&gz, &mut buf).expect("inflates").1,
            plain.len()
        );
        assert_eq!(at_limit.finish().expect("ends"), plain.len() as u64);
        let mut below = Gunzip::new(plain.len() as u64 - 1);
        assert_eq!(
            below.inflate(&gz, &mut buf).expect_err("refused"),
            ImportError::TooLarge {
                limit_bytes: plain.len() as u64 - 1
            }
        );
    }
}
