//! Parsing of Kubernetes resource quantities (`500m`, `1Gi`, `1e3`), enough to check that a
//! quantity is well formed and to compare two of them.

/// Why a string is not a Kubernetes quantity.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")]
pub struct QuantityError;

/// Parses a quantity into its numeric value (approximated as `f64`, which is enough to compare
/// quantities and check their sign).
pub fn parse(input: &str) -> Result<f64, QuantityError> {
    let (number, suffix) = split_number(input)?;
    let value: f64 = number.parse().map_err(|_| QuantityError)?;
    let multiplier = suffix_multiplier(suffix)?;
    let result = value * multiplier;
    if result.is_finite() {
        Ok(result)
    } else {
        Err(QuantityError)
    }
}

/// A quantity as a whole number of bytes (rounded; negative values count as 0), for sizes:
/// volumes, quotas. `None` when it does not parse.
pub fn bytes(input: &str) -> Option<u64> {
    let value = parse(input).ok()?;
    // Sizes are far below 2^53, where f64 holds integers exactly; truncation is intended.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Some(value.max(0.0).round() as u64)
}

fn split_number(input: &str) -> Result<(&str, &str), QuantityError> {
    let bytes = input.as_bytes();
    let mut end = 0;
    if matches!(bytes.first(), Some(b'+' | b'-')) {
        end = 1;
    }
    let mut digits = 0;
    let mut dots = 0;
    while let Some(&b) = bytes.get(end) {
        match b {
            b'0'..=b'9' => digits += 1,
            b'.' => dots += 1,
            _ => break,
        }
        end += 1;
    }
    if digits == 0 || dots > 1 {
        return Err(QuantityError);
    }
    let number = input.get(..end).ok_or(QuantityError)?;
    let suffix = input.get(end..).ok_or(QuantityError)?;
    Ok((number, suffix))
}

fn suffix_multiplier(suffix: &str) -> Result<f64, QuantityError> {
    Ok(match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exponent => {
            let digits = exponent.strip_prefix(['e', 'E']).ok_or(QuantityError)?;
            let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return Err(QuantityError);
            }
            let power: i32 = digits.parse().map_err(|_| QuantityError)?;
            10f64.powi(power)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_whole_bytes() {
        assert_eq!(bytes("2Gi"), Some(2 << 30));
        assert_eq!(bytes("1.5Ki"), Some(1536));
        assert_eq!(bytes("-1"), Some(0));
        assert_eq!(bytes("2GiB"), None);
    }

    #[test]
    fn parses_valid_quantities() {
        let cases = [
            ("1", 1.0),
            ("500m", 0.5),
            ("1Gi", 1_073_741_824.0),
            ("1.5Gi", 1_610_612_736.0),
            ("2k", 2000.0),
            ("1e3", 1000.0),
            ("1E-3", 0.001),
            ("+1M", 1e6),
            ("-1", -1.0),
            (".5", 0.5),
            ("5.", 5.0),
        ];
        for (input, want) in cases {
            assert_eq!(parse(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn rejects_malformed_quantities() {
        for input in [
            "", "Gi", "1GB", "1 Gi", "1.2.3", "abc", "1e", "1Ki2", "--1", "1gi", ".",
        ] {
            assert_eq!(parse(input), Err(QuantityError), "{input}");
        }
    }
}
