//! Text decoding for protocol-0 opcodes (`STRING`, `UNICODE`).

/// Python's `codecs.escape_decode` (the `STRING` opcode's body).
pub(super) fn escape_decode(src: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    while let Some(&b) = src.get(i) {
        i += 1;
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let Some(&e) = src.get(i) else {
            out.push(b'\\');
            break;
        };
        i += 1;
        match e {
            b'\n' => {}
            b'\\' => out.push(b'\\'),
            b'\'' => out.push(b'\''),
            b'"' => out.push(b'"'),
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'0'..=b'7' => {
                let mut v = u32::from(e - b'0');
                for _ in 0..2 {
                    match src.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push(v as u8);
            }
            b'x' => {
                let hex = src
                    .get(i..i + 2)
                    .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
                if let Some(v) = hex {
                    out.push(v);
                    i += 2;
                } else {
                    out.extend_from_slice(b"\\x");
                }
            }
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
}

/// Python's `raw-unicode-escape` decoding (the `UNICODE` opcode), written as UTF-8.
pub(super) fn raw_unicode_decode(src: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    let mut buf = [0u8; 4];
    while let Some(&b) = src.get(i) {
        i += 1;
        let width = match (b, src.get(i)) {
            (b'\\', Some(b'u')) => 4,
            (b'\\', Some(b'U')) => 8,
            _ => 0,
        };
        let code = (width > 0)
            .then(|| src.get(i + 1..i + 1 + width))
            .flatten()
            .and_then(|h| u32::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        let c = if let Some(code) = code {
            i += 1 + width;
            char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER)
        } else {
            char::from(b) // latin-1
        };
        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
    }
}
