//! Byte sizes: parsing the CLI's `SIZE` and printing sizes the way PyTorch prints them.

/// Parses `SIZE`: a number with a unit, case-insensitive — `B`, `KiB`, `MiB`, `GiB`, `TiB`
/// (powers of 2) or `KB`, `MB`, `GB`, `TB` (powers of 10); decimals allowed, rounded down
/// to a byte. A bare number is bytes only when it is a whole number ≥ 1 MiB (a count of
/// bytes copied from a report); anything else without a unit is an error that suggests
/// the unit (`1.2` is far more likely 1.2 GiB than one byte).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    if num.is_empty() || num.matches('.').count() > 1 || num == "." {
        return Err(format!(
            "bad size '{text}': expected a number with a unit, e.g. 2.2GiB"
        ));
    }
    let mult: f64 = match unit.as_str() {
        "" => {
            return match num.parse::<u64>() {
                Ok(b) if b >= 1 << 20 => Ok(b),
                _ => Err(format!(
                    "bad size '{text}': a number without a unit must be a whole number of bytes ≥ 1048576 (1 MiB); did you mean {num}GiB?"
                )),
            };
        }
        "b" => 1.0,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => {
            return Err(format!(
                "bad size '{text}': unknown unit '{unit}' (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"
            ));
        }
    };
    if !num.contains('.') && unit == "b" {
        return num
            .parse::<u64>()
            .map_err(|e| format!("bad size '{text}': {e}"));
    }
    let v: f64 = num.parse().map_err(|e| format!("bad size '{text}': {e}"))?;
    let bytes = (v * mult).floor();
    if !(0.0..1.8e19).contains(&bytes) {
        return Err(format!("bad size '{text}': out of range"));
    }
    Ok(bytes as u64)
}

/// Formats bytes as PyTorch's `format_size` does: `512.00 KiB`, `20.00 MiB`, `1.50 GiB`.
#[must_use]
pub fn format_size(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    // PyTorch's `format_size`: a unit covers up to and including its own next power
    // (exactly 1 GiB prints as "1024.00 MiB").
    if bytes <= 1024 {
        format!("{bytes} bytes")
    } else if b <= KIB * KIB {
        format!("{:.2} KiB", b / KIB)
    } else if b <= KIB * KIB * KIB {
        format!("{:.2} MiB", b / (KIB * KIB))
    } else {
        format!("{:.2} GiB", b / (KIB * KIB * KIB))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        assert_eq!(parse_size("1024B").unwrap(), 1024);
        assert_eq!(parse_size("2566914047").unwrap(), 2_566_914_047);
        assert_eq!(parse_size("2MiB").unwrap(), 2 << 20);
        assert_eq!(
            parse_size("2.2GiB").unwrap(),
            (2.2 * (1u64 << 30) as f64) as u64
        );
        assert_eq!(parse_size("1.5 KB").unwrap(), 1500);
        assert_eq!(parse_size("0.5B").unwrap(), 0);
        assert!(parse_size("12XB").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("1.2.3MiB").is_err());
    }

    #[test]
    fn units_are_case_insensitive_and_a_bare_number_is_whole_bytes_of_at_least_a_mib() {
        assert_eq!(parse_size("1.2gib").unwrap(), parse_size("1.2GiB").unwrap());
        assert_eq!(parse_size("3 mb").unwrap(), 3_000_000);
        assert_eq!(parse_size("1048576").unwrap(), 1 << 20);
        for bad in ["1.2", "1024", "1048575", "-1", ".", "MiB"] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.starts_with(&format!("bad size '{bad}'")), "{e}");
        }
        assert!(
            parse_size("1.2")
                .unwrap_err()
                .contains("did you mean 1.2GiB?")
        );
    }

    #[test]
    fn sizes_print_like_pytorch() {
        assert_eq!(format_size(400 << 20), "400.00 MiB");
        assert_eq!(format_size(3 << 29), "1.50 GiB");
        assert_eq!(format_size(512), "512 bytes");
        assert_eq!(format_size(1536), "1.50 KiB");
        // PyTorch's boundaries: a power of 1024 still prints in the unit below.
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1 << 20), "1024.00 KiB");
        assert_eq!(format_size(1 << 30), "1024.00 MiB");
        assert_eq!(format_size((1 << 30) + (1 << 21)), "1.00 GiB");
    }
}
