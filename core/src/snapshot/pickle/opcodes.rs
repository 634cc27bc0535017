//! Opcodes: the byte values, which ones are refused, and how their arguments are read
//! (shared by the pre-pass and the machine so that both see the same opcode boundaries).

pub(super) mod op {
    pub const MARK: u8 = b'(';
    pub const STOP: u8 = b'.';
    pub const POP: u8 = b'0';
    pub const POP_MARK: u8 = b'1';
    pub const DUP: u8 = b'2';
    pub const FLOAT: u8 = b'F';
    pub const INT: u8 = b'I';
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const LONG: u8 = b'L';
    pub const BININT2: u8 = b'M';
    pub const NONE: u8 = b'N';
    pub const PERSID: u8 = b'P';
    pub const BINPERSID: u8 = b'Q';
    pub const REDUCE: u8 = b'R';
    pub const STRING: u8 = b'S';
    pub const BINSTRING: u8 = b'T';
    pub const SHORT_BINSTRING: u8 = b'U';
    pub const UNICODE: u8 = b'V';
    pub const BINUNICODE: u8 = b'X';
    pub const APPEND: u8 = b'a';
    pub const BUILD: u8 = b'b';
    pub const GLOBAL: u8 = b'c';
    pub const DICT: u8 = b'd';
    pub const EMPTY_DICT: u8 = b'}';
    pub const APPENDS: u8 = b'e';
    pub const GET: u8 = b'g';
    pub const BINGET: u8 = b'h';
    pub const INST: u8 = b'i';
    pub const LONG_BINGET: u8 = b'j';
    pub const LIST: u8 = b'l';
    pub const EMPTY_LIST: u8 = b']';
    pub const OBJ: u8 = b'o';
    pub const PUT: u8 = b'p';
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const SETITEM: u8 = b's';
    pub const TUPLE: u8 = b't';
    pub const EMPTY_TUPLE: u8 = b')';
    pub const SETITEMS: u8 = b'u';
    pub const BINFLOAT: u8 = b'G';
    pub const PROTO: u8 = 0x80;
    pub const NEWOBJ: u8 = 0x81;
    pub const EXT1: u8 = 0x82;
    pub const EXT2: u8 = 0x83;
    pub const EXT4: u8 = 0x84;
    pub const TUPLE1: u8 = 0x85;
    pub const TUPLE2: u8 = 0x86;
    pub const TUPLE3: u8 = 0x87;
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const LONG1: u8 = 0x8a;
    pub const LONG4: u8 = 0x8b;
    pub const BINBYTES: u8 = b'B';
    pub const SHORT_BINBYTES: u8 = b'C';
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE8: u8 = 0x8d;
    pub const BINBYTES8: u8 = 0x8e;
    pub const EMPTY_SET: u8 = 0x8f;
    pub const ADDITEMS: u8 = 0x90;
    pub const FROZENSET: u8 = 0x91;
    pub const NEWOBJ_EX: u8 = 0x92;
    pub const STACK_GLOBAL: u8 = 0x93;
    pub const MEMOIZE: u8 = 0x94;
    pub const FRAME: u8 = 0x95;
    pub const BYTEARRAY8: u8 = 0x96;
    pub const NEXT_BUFFER: u8 = 0x97;
    pub const READONLY_BUFFER: u8 = 0x98;
}

/// Why an opcode is refused, or `None` if the machine runs it.
pub(super) fn refusal(byte: u8) -> Option<(&'static str, &'static str)> {
    const CODE: &str = "snapshots never need code execution";
    const EXT: &str = "extension registry codes name classes; snapshots never need them";
    const PERSIST: &str = "persistent ids need a custom unpickler; snapshots never use them";
    const BUFFER: &str = "out-of-band buffers are not supported; snapshots never use them";
    Some(match byte {
        op::GLOBAL => ("GLOBAL", CODE),
        op::STACK_GLOBAL => ("STACK_GLOBAL", CODE),
        op::REDUCE => ("REDUCE", CODE),
        op::BUILD => ("BUILD", CODE),
        op::INST => ("INST", CODE),
        op::OBJ => ("OBJ", CODE),
        op::NEWOBJ => ("NEWOBJ", CODE),
        op::NEWOBJ_EX => ("NEWOBJ_EX", CODE),
        op::EXT1 => ("EXT1", EXT),
        op::EXT2 => ("EXT2", EXT),
        op::EXT4 => ("EXT4", EXT),
        op::PERSID => ("PERSID", PERSIST),
        op::BINPERSID => ("BINPERSID", PERSIST),
        op::NEXT_BUFFER => ("NEXT_BUFFER", BUFFER),
        op::READONLY_BUFFER => ("READONLY_BUFFER", BUFFER),
        _ => return None,
    })
}

pub(super) fn le_u32(data: &[u8], pos: usize) -> Option<u32> {
    let b = data.get(pos..pos.checked_add(4)?)?;
    Some(u32::from_le_bytes(b.try_into().ok()?))
}

pub(super) fn le_u64(data: &[u8], pos: usize) -> Option<u64> {
    let b = data.get(pos..pos.checked_add(8)?)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

/// The line starting at `pos` (without its `\n`) and the position after the `\n`.
pub(super) fn line_at(data: &[u8], pos: usize) -> Option<(&[u8], usize)> {
    let rest = data.get(pos..)?;
    let n = rest.iter().position(|&b| b == b'\n')?;
    Some((rest.get(..n)?, pos + n + 1))
}

/// Size of a length-prefixed opcode's prefix, and whether the length is signed.
pub(super) const fn length_prefix(op: u8) -> Option<(usize, bool)> {
    Some(match op {
        op::SHORT_BINSTRING | op::SHORT_BINBYTES | op::SHORT_BINUNICODE | op::LONG1 => (1, false),
        op::BINSTRING | op::LONG4 => (4, true),
        op::BINBYTES | op::BINUNICODE => (4, false),
        op::BINUNICODE8 | op::BINBYTES8 | op::BYTEARRAY8 => (8, false),
        _ => return None,
    })
}

/// Reads a length prefix at `pos`: `Ok(Some(len))`, `Ok(None)` if truncated, `Err(n)` for
/// a negative signed length `n`.
pub(super) fn read_length(
    data: &[u8],
    pos: usize,
    width: usize,
    signed: bool,
) -> Result<Option<u64>, i64> {
    Ok(Some(match (width, signed) {
        (1, _) => match data.get(pos) {
            Some(&b) => u64::from(b),
            None => return Ok(None),
        },
        (4, false) => match le_u32(data, pos) {
            Some(v) => u64::from(v),
            None => return Ok(None),
        },
        (4, true) => match le_u32(data, pos) {
            Some(v) => {
                let v = v as i32;
                if v < 0 {
                    return Err(i64::from(v));
                }
                v as u64
            }
            None => return Ok(None),
        },
        _ => match le_u64(data, pos) {
            Some(v) => v,
            None => return Ok(None),
        },
    }))
}

/// Number of argument bytes of a fixed-size opcode (0 for none); `None` for opcodes
/// with variable arguments or no meaning.
pub(super) const fn fixed_args(op: u8) -> Option<usize> {
    Some(match op {
        op::MARK
        | op::STOP
        | op::POP
        | op::POP_MARK
        | op::DUP
        | op::NONE
        | op::APPEND
        | op::DICT
        | op::EMPTY_DICT
        | op::APPENDS
        | op::LIST
        | op::EMPTY_LIST
        | op::SETITEM
        | op::TUPLE
        | op::EMPTY_TUPLE
        | op::SETITEMS
        | op::TUPLE1
        | op::TUPLE2
        | op::TUPLE3
        | op::NEWTRUE
        | op::NEWFALSE
        | op::EMPTY_SET
        | op::ADDITEMS
        | op::FROZENSET
        | op::MEMOIZE => 0,
        op::PROTO | op::BININT1 | op::BINGET | op::BINPUT => 1,
        op::BININT2 => 2,
        op::BININT | op::LONG_BINGET | op::LONG_BINPUT => 4,
        op::BINFLOAT | op::FRAME => 8,
        _ => return None,
    })
}

/// Python's `int(line)` for memo indices; `None` if not a small non-negative integer.
pub(super) fn parse_memo_index(line: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(line).ok()?.trim();
    s.strip_prefix('+').unwrap_or(s).parse::<u32>().ok()
}
