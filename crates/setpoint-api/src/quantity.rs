//! Resource quantities (`100m`, `1`, `1.5`, `2Gi`, `512Mi`, `1e3`), exactly.
//!
//! The scheduler compares requests with allocatable amounts, so it needs exact integers:
//! CPU in millicores and everything else in units. Like Kubernetes' `MilliValue()` and
//! `Value()`, fractions round up, so `0.5m` of CPU is `1` millicore and never rounds to free.
//! Quantities compare by value, as Kubernetes' `Cmp` does: `1` equals `1000m`.
//!
//! [`canonical_quantity`] is the text Kubernetes re-serialises a quantity as (`1000m` → `1`,
//! `1.5Gi` → `1536Mi`), which its printers show.

/// Why a quantity did not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not a number followed by a known suffix.
    #[error("quantity {0:?} is not a number with a known suffix")]
    Syntax(String),
    /// Too large for a 64-bit integer of the unit asked for.
    #[error("quantity {0:?} is out of range")]
    Range(String),
}

/// A parsed quantity: `mantissa × 10^exponent` (binary suffixes are already multiplied in),
/// and the notation it was written in, which its canonical form keeps. Equality and order
/// are by value only.
#[derive(Clone, Copy, Debug)]
pub struct Quantity {
    mantissa: i128,
    exponent: i32,
    format: Format,
}

/// Which notation a quantity was written in (Kubernetes' `Format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    /// `5e3`
    DecimalExponent,
    /// `5k`, `500m`, or no suffix
    DecimalSi,
    /// `5Ki`
    BinarySi,
}

/// Binary suffixes: power of 1024.
const BINARY: &[(&str, u32)] = &[
    ("Ki", 1),
    ("Mi", 2),
    ("Gi", 3),
    ("Ti", 4),
    ("Pi", 5),
    ("Ei", 6),
];

/// Decimal suffixes: power of ten.
const DECIMAL: &[(&str, i32)] = &[
    ("n", -9),
    ("u", -6),
    ("m", -3),
    ("", 0),
    ("k", 3),
    ("M", 6),
    ("G", 9),
    ("T", 12),
    ("P", 15),
    ("E", 18),
];

impl Quantity {
    /// Parses Kubernetes' quantity syntax: an optionally signed decimal number followed by a
    /// binary (`Ki` … `Ei`), decimal (`n` … `E`) or exponent (`e3`, `E-2`) suffix.
    pub fn parse(s: &str) -> Result<Quantity, QuantityError> {
        let syntax = || QuantityError::Syntax(s.to_string());
        let range = || QuantityError::Range(s.to_string());
        // No surrounding white space, as Kubernetes' `ParseQuantity`.
        let (negative, rest) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            Some(_) => (false, s),
            None => return Err(syntax()),
        };
        let split = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(split);
        let (int, frac) = number.split_once('.').unwrap_or((number, ""));
        if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
            return Err(syntax());
        }
        let mut mantissa: i128 = 0;
        for c in int.bytes().chain(frac.bytes()) {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(i128::from(c - b'0')))
                .ok_or_else(range)?;
        }
        let mut exponent = -i32::try_from(frac.len()).map_err(|_| range())?;
        let format = if let Some((_, power)) = BINARY.iter().find(|(b, _)| *b == suffix) {
            mantissa = mantissa
                .checked_mul(1024i128.pow(*power))
                .ok_or_else(range)?;
            Format::BinarySi
        } else if let Some((_, power)) = DECIMAL.iter().find(|(d, _)| *d == suffix) {
            exponent += power;
            Format::DecimalSi
        } else if let Some(e) = suffix.strip_prefix(['e', 'E']).filter(|e| !e.is_empty()) {
            let e: i32 = e.parse().map_err(|_| syntax())?;
            exponent = exponent.checked_add(e).ok_or_else(range)?;
            Format::DecimalExponent
        } else {
            return Err(syntax());
        };
        if negative {
            mantissa = -mantissa;
        }
        Ok(Quantity {
            mantissa,
            exponent,
            format,
        })
    }

    /// The canonical text Kubernetes serialises this quantity as: the notation it was written
    /// in, at most nano precision (finer values round away from zero), the smallest integer
    /// mantissa with an exponent that is a multiple of three (`1500m`, `1k`, `12e6`), and for
    /// binary notation the largest suffix that divides the value exactly (`1536Mi`). Binary
    /// notation holds only whole values of at least 1024 in magnitude; others are shown in
    /// decimal. `None` when the value is too large or too fine to handle exactly (above
    /// 10^19 units of its written precision, or an exponent outside -30..=18), which no real
    /// resource amount is.
    pub fn canonical(&self) -> Option<String> {
        let (mut amount, mut exp) = (self.mantissa, self.exponent);
        // Bounds that keep every later step inside i128 (amount × 10^exp stays below 10^38).
        if !(-30..=18).contains(&exp) || amount.abs() >= 10i128.pow(19) {
            return None;
        }
        if exp < -9 {
            let divisor = 10i128.pow((-9 - exp).unsigned_abs());
            let rounded = (amount.abs() + divisor - 1) / divisor;
            amount = rounded * amount.signum();
            exp = -9;
        }
        if amount == 0 {
            return Some("0".to_string());
        }
        let binary = match self.format {
            Format::BinarySi => whole(amount, exp).filter(|v| v.abs() >= 1024),
            _ => None,
        };
        if let Some(mut value) = binary {
            // As many factors of 1024 moved into the suffix as divide the value exactly.
            let mut power = 0;
            while power < BINARY.len() && value % 1024 == 0 {
                value /= 1024;
                power += 1;
            }
            let suffix = match power {
                0 => "",
                p => BINARY[p - 1].0,
            };
            return Some(format!("{value}{suffix}"));
        }
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
        let suffix = match self.format {
            Format::DecimalExponent => None,
            _ => DECIMAL.iter().find(|(_, p)| *p == exp).map(|(s, _)| *s),
        };
        Some(match suffix {
            Some(s) => format!("{mantissa}{s}"),
            None if exp == 0 => mantissa.to_string(),
            None => format!("{mantissa}e{exp}"),
        })
    }

    /// The value scaled by `10^scale`, rounded up (towards positive infinity).
    fn scaled(&self, scale: i32) -> Option<i64> {
        let e = self.exponent.checked_add(scale)?;
        let v = if e >= 0 {
            // Zero stays zero however large the exponent.
            if self.mantissa == 0 {
                0
            } else {
                self.mantissa
                    .checked_mul(10i128.checked_pow(u32::try_from(e).ok()?)?)?
            }
        } else {
            match 10i128.checked_pow(e.unsigned_abs()) {
                Some(d) => {
                    let q = self.mantissa.div_euclid(d);
                    if self.mantissa.rem_euclid(d) != 0 {
                        q + 1
                    } else {
                        q
                    }
                }
                // A divisor beyond i128: any non-zero positive value is a fraction of one.
                None => i128::from(self.mantissa > 0),
            }
        };
        i64::try_from(v).ok()
    }

    /// Whether the quantity is above zero.
    pub fn is_positive(&self) -> bool {
        self.mantissa > 0
    }

    /// Whether the quantity is below zero.
    pub fn is_negative(&self) -> bool {
        self.mantissa < 0
    }

    /// Whole units, rounded up (Kubernetes' `Value()`): bytes of memory, pods.
    pub fn value(&self) -> Option<i64> {
        self.scaled(0)
    }

    /// Thousandths, rounded up (Kubernetes' `MilliValue()`): millicores of CPU.
    pub fn milli_value(&self) -> Option<i64> {
        self.scaled(3)
    }

    /// A whole number of units as a quantity in decimal notation.
    pub fn from_integer(value: i64) -> Quantity {
        Quantity {
            mantissa: i128::from(value),
            exponent: 0,
            format: Format::DecimalSi,
        }
    }

    /// The quantity with its sign flipped, in the same notation.
    pub fn negated(&self) -> Quantity {
        Quantity {
            mantissa: -self.mantissa,
            ..*self
        }
    }

    /// -1, 0 or 1 by the quantity's sign (Kubernetes' `Sign()`).
    pub fn signum(&self) -> i64 {
        self.mantissa.signum() as i64
    }

    /// The value when it is a whole number that fits an `i64`, exactly (no rounding):
    /// Kubernetes' `AsInt64()`.
    pub fn as_exact_integer(&self) -> Option<i64> {
        let v = if self.exponent >= 0 {
            if self.mantissa == 0 {
                0
            } else {
                self.mantissa
                    .checked_mul(10i128.checked_pow(self.exponent.unsigned_abs())?)?
            }
        } else {
            let d = 10i128.checked_pow(self.exponent.unsigned_abs());
            match d {
                Some(d) if self.mantissa % d == 0 => self.mantissa / d,
                // A divisor beyond i128 divides only zero.
                None if self.mantissa == 0 => 0,
                _ => return None,
            }
        };
        i64::try_from(v).ok()
    }

    /// The value as the nearest `f64` (Kubernetes' `AsApproximateFloat64()`).
    pub fn as_approximate_float(&self) -> f64 {
        self.mantissa as f64 * 10f64.powi(self.exponent)
    }
}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// By value, whatever the notation: both sides are brought to the smaller exponent; a side
/// that cannot be (its value is beyond `i128` at that exponent) is the larger in magnitude.
impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        let sign = |m: i128| m.signum();
        if sign(self.mantissa) != sign(other.mantissa) || self.mantissa == 0 {
            return sign(self.mantissa).cmp(&sign(other.mantissa));
        }
        let e = self.exponent.min(other.exponent);
        let at = |q: &Quantity| {
            10i128
                .checked_pow((q.exponent - e).unsigned_abs())
                .and_then(|f| q.mantissa.checked_mul(f))
        };
        match (at(self), at(other)) {
            (Some(a), Some(b)) => a.cmp(&b),
            // Only the one with the larger exponent can overflow: it is larger in magnitude.
            (None, _) if self.mantissa > 0 => Ordering::Greater,
            (None, _) => Ordering::Less,
            (_, None) if other.mantissa > 0 => Ordering::Less,
            (_, None) => Ordering::Greater,
        }
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for Quantity {}

impl std::ops::Add for Quantity {
    type Output = Option<Quantity>;
    /// The sum, or `None` when it is beyond `i128` at the smaller exponent.
    fn add(self, other: Quantity) -> Option<Quantity> {
        let e = self.exponent.min(other.exponent);
        let at = |q: &Quantity| {
            10i128
                .checked_pow(q.exponent.abs_diff(e))
                .and_then(|f| q.mantissa.checked_mul(f))
        };
        Some(Quantity {
            mantissa: at(&self)?.checked_add(at(&other)?)?,
            exponent: e,
            // Kubernetes' `Add` keeps the receiver's notation unless the receiver is zero.
            format: if self.mantissa == 0 {
                other.format
            } else {
                self.format
            },
        })
    }
}

/// `amount × 10^exp` as an integer, if it is one. The caller keeps `|amount| < 10^19` and
/// `|exp| <= 30`, so nothing overflows.
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

/// The canonical form of a quantity ([`Quantity::canonical`]), or the text unchanged when it
/// does not parse or is beyond what the canonical form handles exactly. Surrounding white
/// space is ignored: this is for showing stored values, not for validating them.
pub fn canonical_quantity(s: &str) -> String {
    Quantity::parse(s.trim())
        .ok()
        .and_then(|q| q.canonical())
        .unwrap_or_else(|| s.to_string())
}

/// Millicores in a CPU quantity; an unparsable or out-of-range quantity is an error.
pub fn milli_cpu(s: &str) -> Result<i64, QuantityError> {
    Quantity::parse(s)?
        .milli_value()
        .ok_or_else(|| QuantityError::Range(s.to_string()))
}

/// Whole units of a quantity (bytes, pods); an unparsable or out-of-range quantity is an error.
pub fn units(s: &str) -> Result<i64, QuantityError> {
    Quantity::parse(s)?
        .value()
        .ok_or_else(|| QuantityError::Range(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::canonical_quantity as c;
    use super::*;

    #[test]
    fn compares_by_value() {
        let q = |s| Quantity::parse(s).unwrap();
        assert_eq!(q("1"), q("1000m"));
        assert_eq!(q("1Ki"), q("1024"));
        assert_eq!(q("1e3"), q("1k"));
        assert!(q("999m") < q("1"));
        assert!(q("-1") < q("0"));
        assert!(q("1E18") > q("1n"));
        assert!(q("0") == q("0Ki"));
        assert_eq!((q("500m") + q("0.5")).unwrap(), q("1"));
        assert!(!q("0").is_positive() && q("1n").is_positive());
    }

    #[test]
    fn cpu_in_millicores() {
        assert_eq!(milli_cpu("100m"), Ok(100));
        assert_eq!(milli_cpu("1"), Ok(1000));
        assert_eq!(milli_cpu("1.5"), Ok(1500));
        assert_eq!(milli_cpu("0.1"), Ok(100));
        assert_eq!(milli_cpu(".5"), Ok(500));
        assert_eq!(milli_cpu("2000m"), Ok(2000));
        assert_eq!(milli_cpu("64"), Ok(64_000));
        assert_eq!(milli_cpu("0"), Ok(0));
        assert_eq!(milli_cpu("+3"), Ok(3000));
    }

    #[test]
    fn fractions_round_up_like_kubernetes() {
        assert_eq!(milli_cpu("0.5m"), Ok(1));
        assert_eq!(milli_cpu("1u"), Ok(1));
        assert_eq!(milli_cpu("100n"), Ok(1));
        assert_eq!(units("0.5"), Ok(1));
        assert_eq!(units("1.5Ki"), Ok(1536));
        assert_eq!(units("0.1Ki"), Ok(103)); // 102.4 rounds up
        assert_eq!(units("-0.5"), Ok(0)); // ceiling, not away from zero
    }

    #[test]
    fn memory_in_bytes() {
        assert_eq!(units("2Gi"), Ok(2 * 1024 * 1024 * 1024));
        assert_eq!(units("512Mi"), Ok(512 * 1024 * 1024));
        assert_eq!(units("1Ki"), Ok(1024));
        assert_eq!(units("1Ti"), Ok(1 << 40));
        assert_eq!(units("1Ei"), Ok(1 << 60));
        assert_eq!(units("1G"), Ok(1_000_000_000));
        assert_eq!(units("128974848"), Ok(128_974_848));
        assert_eq!(units("129e6"), Ok(129_000_000));
        assert_eq!(units("123M"), Ok(123_000_000));
        assert_eq!(units("1k"), Ok(1000));
        assert_eq!(units("110"), Ok(110));
        assert_eq!(units("1E"), Ok(1_000_000_000_000_000_000));
        assert_eq!(units("12e-1"), Ok(2));
    }

    #[test]
    fn exponent_is_not_confused_with_exa() {
        assert_eq!(units("1E"), Ok(10i64.pow(18)));
        assert_eq!(units("1E2"), Ok(100));
        assert_eq!(units("5e3"), Ok(5000));
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "", " ", "abc", "1Gb", "1.2.3", "m", "1e", "1ki", "--1", "1 Gi",
        ] {
            assert!(
                matches!(Quantity::parse(bad), Err(QuantityError::Syntax(_))),
                "{bad:?} should not parse"
            );
        }
    }

    #[test]
    fn out_of_range_is_an_error_not_a_wrap() {
        assert!(matches!(units("16Ei"), Err(QuantityError::Range(_))));
        assert!(matches!(milli_cpu("1E"), Err(QuantityError::Range(_))));
        assert!(matches!(
            units("99999999999999999999999999999999999999999"),
            Err(QuantityError::Range(_))
        ));
        assert_eq!(units("0e400"), Ok(0));
        assert_eq!(units("1e-400"), Ok(1));
    }

    #[test]
    fn canonical_decimal() {
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
    fn canonical_binary() {
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
    fn canonical_exponent() {
        assert_eq!(c("1e3"), "1e3");
        assert_eq!(c("12e6"), "12e6");
        assert_eq!(c("1000e0"), "1e3");
        assert_eq!(c("1.5e3"), "1500");
    }

    #[test]
    fn canonical_passes_unparsable_text_through() {
        assert_eq!(c("abc"), "abc");
        assert_eq!(c("1Qi"), "1Qi");
        assert_eq!(c(""), "");
    }

    #[test]
    fn canonical_rounds_below_nano_and_keeps_the_notation_of_sums() {
        assert_eq!(c("0.1n"), "1n");
        assert_eq!(c("-0.1n"), "-1n");
        assert_eq!(c("1.5n"), "2n");
        assert_eq!(c("1e-10"), "1e-9");
        assert_eq!(c(" 1000m "), "1");
        assert_eq!(c("16Ei"), "16Ei");
        let q = |s| Quantity::parse(s).unwrap();
        assert_eq!(
            (q("1Gi") + q("512Mi")).unwrap().canonical().unwrap(),
            "1536Mi"
        );
        assert_eq!((q("0") + q("1Ki")).unwrap().canonical().unwrap(), "1Ki");
        assert_eq!((q("1") + q("1Ki")).unwrap().canonical().unwrap(), "1025");
    }

    #[test]
    fn exact_integers_signs_and_floats() {
        let q = |s| Quantity::parse(s).unwrap();
        assert_eq!(q("1k").as_exact_integer(), Some(1000));
        assert_eq!(q("1500m").as_exact_integer(), None);
        assert_eq!(q("2000m").as_exact_integer(), Some(2));
        assert_eq!(q("1Ki").as_exact_integer(), Some(1024));
        assert_eq!(q("100E").as_exact_integer(), None, "beyond i64");
        assert_eq!(q("-5").signum(), -1);
        assert_eq!(q("0").signum(), 0);
        assert_eq!(q("1.5").negated(), q("-1500m"));
        assert_eq!(Quantity::from_integer(3), q("3000m"));
        assert!((q("1.5Gi").as_approximate_float() - 1_610_612_736.0).abs() < 1e-3);
    }
}
