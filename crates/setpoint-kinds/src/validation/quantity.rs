//! Resource quantities (`100m`, `1.5Gi`, `2e3`): their value and Kubernetes' format error.

use serde_json::Value;

/// The value of a resource quantity (`100m`, `1.5Gi`, `2e3`, or a JSON number), or `None` when
/// it does not match Kubernetes' quantity grammar.
pub fn parse_quantity(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => parse_quantity_str(s),
        _ => None,
    }
}

fn parse_quantity_str(s: &str) -> Option<f64> {
    let (sign, rest) = match s.as_bytes().first()? {
        b'+' => (1.0, &s[1..]),
        b'-' => (-1.0, &s[1..]),
        _ => (1.0, s),
    };
    let num_len = rest
        .bytes()
        .take_while(|c| c.is_ascii_digit() || *c == b'.')
        .count();
    let (num, suffix) = rest.split_at(num_len);
    if num.is_empty() || num == "." || num.matches('.').count() > 1 {
        return None;
    }
    let base: f64 = num
        .parse()
        .ok()
        .or_else(|| format!("{num}0").parse().ok())?;
    let factor = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exp if exp.starts_with(['e', 'E']) => {
            let digits = &exp[1..];
            let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if unsigned.is_empty() || !unsigned.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            10f64.powi(digits.parse::<i32>().ok()?)
        }
        _ => return None,
    };
    Some(sign * base * factor)
}

pub(super) fn quantity_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub(super) const QUANTITY_FORMAT_ERROR: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
