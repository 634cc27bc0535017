//! Integers of any width: little-endian two's complement bytes, decimal literals.

use super::value::Value;

/// Python's limit on decimal integer literals (`sys.get_int_max_str_digits()`), which
/// also keeps the quadratic decimal-to-binary conversion cheap.
pub(super) const MAX_INT_DIGITS: usize = 4300;

/// The minimal length of a little-endian two's complement number (redundant sign
/// bytes at the top dropped).
pub(super) fn minimal_len(bytes: &[u8]) -> usize {
    let mut n = bytes.len();
    while n >= 2 {
        let (Some(&top), Some(&below)) = (bytes.get(n - 1), bytes.get(n - 2)) else {
            break;
        };
        let redundant = (top == 0 && below & 0x80 == 0) || (top == 0xff && below & 0x80 != 0);
        if !redundant {
            break;
        }
        n -= 1;
    }
    if n == 1 && bytes.first() == Some(&0) {
        0
    } else {
        n
    }
}

/// Little-endian two's complement bytes as an `i128`, if they fit.
pub(super) fn le_to_i128(bytes: &[u8]) -> Option<i128> {
    if bytes.len() > 16 {
        return None;
    }
    let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
    let mut buf = if negative { [0xffu8; 16] } else { [0u8; 16] };
    buf.get_mut(..bytes.len())?.copy_from_slice(bytes);
    Some(i128::from_le_bytes(buf))
}

pub(super) fn int_value(v: i128) -> Option<Value> {
    if let Ok(i) = i64::try_from(v) {
        Some(Value::Int(i))
    } else if let Ok(u) = u64::try_from(v) {
        Some(Value::UInt(u))
    } else {
        None
    }
}

/// Decimal digits (with optional sign and surrounding whitespace) as little-endian two's
/// complement bytes; `None` if not an integer literal.
pub(super) fn decimal_to_le(text: &[u8]) -> Option<Vec<u8>> {
    let s = std::str::from_utf8(text).ok()?.trim();
    let (negative, digits) = match s.as_bytes().first()? {
        b'-' => (true, s.get(1..)?),
        b'+' => (false, s.get(1..)?),
        _ => (false, s),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Magnitude in base-2^64 limbs, fed 19 decimal digits at a time.
    let mut limbs: Vec<u64> = vec![0];
    for chunk in digits.as_bytes().chunks(19) {
        let mut mul = 1u128;
        let mut add = 0u128;
        for &d in chunk {
            mul *= 10;
            add = add * 10 + u128::from(d - b'0');
        }
        let mut carry = add;
        for limb in &mut limbs {
            let v = u128::from(*limb) * mul + carry;
            *limb = v as u64;
            carry = v >> 64;
        }
        if carry != 0 {
            limbs.push(carry as u64);
        }
    }
    let mut bytes: Vec<u8> = limbs.iter().flat_map(|l| l.to_le_bytes()).collect();
    bytes.push(0); // room for the sign bit
    if negative {
        // Two's complement: invert and add one.
        let mut carry = true;
        for b in &mut bytes {
            let (v, c) = (!*b).overflowing_add(u8::from(carry));
            *b = v;
            carry = c;
        }
    }
    let n = minimal_len(&bytes);
    bytes.truncate(n);
    Some(bytes)
}
