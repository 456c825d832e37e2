//! Canonical text of a Kubernetes resource quantity (`1000m` → `1`, `1.5Gi` → `1536Mi`).
//!
//! Kubernetes re-serialises every quantity it stores in canonical form, and its printers show
//! that form. Quota and autoscaler cells go through here so they read the same whether or not
//! the stored object was normalised on write.

/// Decimal SI suffixes by power of ten.
const DECIMAL_SUFFIXES: &[(i32, &str)] = &[
    (-9, "n"),
    (-6, "u"),
    (-3, "m"),
    (0, ""),
    (3, "k"),
    (6, "M"),
    (9, "G"),
    (12, "T"),
    (15, "P"),
    (18, "E"),
];

/// Binary SI suffixes, by power of 1024.
const BINARY_SUFFIXES: &[&str] = &["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];

/// Which notation a quantity was written in; the canonical form keeps it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Format {
    /// `5e3`
    DecimalExponent,
    /// `5k`, `500m`, or no suffix
    DecimalSi,
    /// `5Ki`
    BinarySi,
}

/// Returns the canonical form of a quantity, or the input unchanged when it does not parse (or
/// is too large to handle exactly, which real quotas never are).
pub fn canonical_quantity(s: &str) -> String {
    parse(s)
        .map(|(amount, exp, format)| format_canonical(amount, exp, format))
        .unwrap_or_else(|| s.to_string())
}

/// Parses into `amount × 10^exp` and the notation used.
fn parse(s: &str) -> Option<(i128, i32, Format)> {
    let s = s.trim();
    let (negative, rest) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let number_len = rest
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_len);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    let mut amount: i128 = 0;
    for c in int_part.chars().chain(frac_part.chars()) {
        amount = amount
            .checked_mul(10)?
            .checked_add(i128::from(c.to_digit(10)?))?;
    }
    let mut exp = -i32::try_from(frac_part.len()).ok()?;

    // Binary first: `Ei` must not be read as an exponent.
    let format = if let Some(power) = BINARY_SUFFIXES.iter().skip(1).position(|b| *b == suffix) {
        for _ in 0..=power {
            amount = amount.checked_mul(1024)?;
        }
        Format::BinarySi
    } else if let Some(e) = suffix.strip_prefix(['e', 'E']).filter(|e| !e.is_empty()) {
        exp = exp.checked_add(e.parse::<i32>().ok()?)?;
        Format::DecimalExponent
    } else {
        let (power, _) = DECIMAL_SUFFIXES.iter().find(|(_, d)| *d == suffix)?;
        exp = exp.checked_add(*power)?;
        Format::DecimalSi
    };
    // Bounds that keep every later step inside i128 (amount × 10^exp stays below 10^38).
    if !(-30..=18).contains(&exp) || amount >= 10i128.pow(19) {
        return None;
    }
    // Quantities keep nano precision at most; finer values round up (away from zero).
    if exp < -9 {
        let divisor = 10i128.checked_pow(u32::try_from(-9 - exp).ok()?)?;
        amount = (amount + divisor - 1) / divisor;
        exp = -9;
    }
    Some((if negative { -amount } else { amount }, exp, format))
}

fn format_canonical(amount: i128, exp: i32, format: Format) -> String {
    if amount == 0 {
        return "0".to_string();
    }
    // Binary notation is kept only for whole values of at least 1024 in magnitude; anything
    // else would need rounding or read oddly, so it is shown in decimal.
    let binary = match format {
        Format::BinarySi => whole(amount, exp).filter(|v| v.abs() >= 1024),
        _ => None,
    };
    match binary {
        Some(mut value) => {
            // The integer value with as many factors of 1024 moved into the suffix as divide it
            // exactly.
            let mut power = 0;
            while power + 1 < BINARY_SUFFIXES.len() && value % 1024 == 0 {
                value /= 1024;
                power += 1;
            }
            format!("{value}{}", BINARY_SUFFIXES[power])
        }
        None => {
            // Decimal: the smallest integer mantissa whose exponent is a multiple of three.
            let (mut mantissa, mut exp) = (amount, exp);
            while mantissa % 10 == 0 {
                mantissa /= 10;
                exp += 1;
            }
            while exp.rem_euclid(3) != 0 {
                mantissa *= 10;
                exp -= 1;
            }
            // Binary quantities that land here are shown as decimal SI.
            let suffix = match format {
                Format::DecimalExponent => None,
                _ => DECIMAL_SUFFIXES
                    .iter()
                    .find(|(p, _)| *p == exp)
                    .map(|(_, s)| s.to_string()),
            };
            let suffix = suffix.unwrap_or_else(|| {
                if exp == 0 {
                    String::new()
                } else {
                    format!("e{exp}")
                }
            });
            format!("{mantissa}{suffix}")
        }
    }
}

/// `amount × 10^exp` as an integer, if it is one.
fn whole(amount: i128, exp: i32) -> Option<i128> {
    let scale = 10i128.pow(exp.unsigned_abs());
    if exp >= 0 {
        Some(amount * scale)
    } else if amount % scale == 0 {
        Some(amount / scale)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::canonical_quantity as c;

    #[test]
    fn decimal() {
        assert_eq!(c("1000m"), "1");
        assert_eq!(c("1500m"), "1500m");
        assert_eq!(c("0.5"), "500m");
        assert_eq!(c("1000"), "1k");
        assert_eq!(c("1500"), "1500");
        assert_eq!(c("100"), "100");
        assert_eq!(c("2000000"), "2M");
        assert_eq!(c("10"), "10");
        assert_eq!(c("250m"), "250m");
        assert_eq!(c("0.1m"), "100u");
        assert_eq!(c("0"), "0");
        assert_eq!(c("0m"), "0");
        assert_eq!(c("-1000m"), "-1");
        assert_eq!(c("1.5k"), "1500");
        assert_eq!(c("1E"), "1E");
    }

    #[test]
    fn binary() {
        assert_eq!(c("1Gi"), "1Gi");
        assert_eq!(c("1024Mi"), "1Gi");
        assert_eq!(c("1.5Gi"), "1536Mi");
        assert_eq!(c("0.5Gi"), "512Mi");
        assert_eq!(c("512Ki"), "512Ki");
        assert_eq!(c("1Ki"), "1Ki");
        // Below 1024 binary reads oddly, so it turns decimal.
        assert_eq!(c("0.5Ki"), "512");
        // Not a whole number of bytes: decimal, to keep precision.
        assert_eq!(c("1.1Ki"), "1126400m");
        assert_eq!(c("100Mi"), "100Mi");
        assert_eq!(c("1Ei"), "1Ei");
        assert_eq!(c("2048Pi"), "2Ei");
    }

    #[test]
    fn exponent() {
        assert_eq!(c("1e3"), "1e3");
        assert_eq!(c("12e6"), "12e6");
        assert_eq!(c("1000e0"), "1e3");
        assert_eq!(c("1.5e3"), "1500");
    }

    #[test]
    fn unparsable_passes_through() {
        assert_eq!(c("abc"), "abc");
        assert_eq!(c("1Qi"), "1Qi");
        assert_eq!(c(""), "");
    }
}
