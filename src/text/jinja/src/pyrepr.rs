//! Python's `str()` and `repr()` of template values, which is what Jinja2 prints for `{{ value }}`
//! and what its `string` filter returns.

use std::fmt::Write;

use minijinja::value::ValueKind;
use minijinja::{Error, Value};

/// `repr(float)`: the shortest digits that round-trip, in scientific notation when the decimal
/// point would sit more than 16 places right or 4 places left of the first digit.
pub fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_string();
    }
    if x.is_infinite() {
        return if x < 0.0 { "-inf" } else { "inf" }.to_string();
    }
    // Rust's `{:e}` gives the shortest round-trip digits as "d.ddde±x".
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap();
    let exp: i32 = exp.parse().unwrap();
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let decpt = exp + 1;
    if (-4 < decpt) && (decpt <= 16) {
        let n = digits.len() as i32;
        let body = if decpt <= 0 {
            format!("0.{}{}", "0".repeat((-decpt) as usize), digits)
        } else if decpt >= n {
            format!("{}{}.0", digits, "0".repeat((decpt - n) as usize))
        } else {
            format!(
                "{}.{}",
                &digits[..decpt as usize],
                &digits[decpt as usize..]
            )
        };
        format!("{sign}{body}")
    } else {
        let frac = &digits[1..];
        let exp_sign = if exp < 0 { '-' } else { '+' };
        let dot = if frac.is_empty() {
            String::new()
        } else {
            format!(".{frac}")
        };
        format!("{sign}{}{dot}e{exp_sign}{:02}", &digits[..1], exp.abs())
    }
}

pub fn as_float(value: &Value) -> Option<f64> {
    (value.kind() == ValueKind::Number && !value.is_integer())
        .then(|| f64::try_from(value.clone()).ok())
        .flatten()
}

/// Characters Python's `str.isprintable()` rejects beyond ASCII controls: the C1 controls and
/// the separator and format characters that chat data meets (no-break and typographic spaces,
/// zero-width joiners, direction marks, BOM, tags, private use).
fn is_unprintable(c: char) -> bool {
    matches!(c as u32,
        0x80..=0xa0 | 0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x890..=0x891 | 0x8e2
        | 0x1680 | 0x180e | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x2064
        | 0x2066..=0x206f | 0x3000 | 0xd800..=0xf8ff | 0xfeff | 0xfff9..=0xfffb
        | 0x110bd | 0x110cd | 0x13430..=0x1343f | 0x1bca0..=0x1bca3 | 0x1d173..=0x1d17a
        | 0xe0001 | 0xe0020..=0xe007f | 0xf0000..)
}

/// `repr(str)`: single quotes unless the text has a single quote and no double quote.
pub fn string_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                write!(out, "\\x{:02x}", c as u32).unwrap()
            }
            c if is_unprintable(c) => {
                let n = c as u32;
                if n <= 0xff {
                    write!(out, "\\x{n:02x}").unwrap();
                } else if n <= 0xffff {
                    write!(out, "\\u{n:04x}").unwrap();
                } else {
                    write!(out, "\\U{n:08x}").unwrap();
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

fn write_repr(value: &Value, out: &mut String) -> Result<(), Error> {
    match value.kind() {
        ValueKind::String => string_repr(value.as_str().unwrap_or_default(), out),
        ValueKind::Undefined => out.push_str("Undefined"),
        _ => write_str_into(value, out)?,
    }
    Ok(())
}

fn write_str_into(value: &Value, out: &mut String) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::Number => match as_float(value) {
            Some(f) => out.push_str(&float_repr(f)),
            None => write!(out, "{value}").unwrap(),
        },
        ValueKind::Seq => {
            let tuple = value.is_tuple();
            out.push(if tuple { '(' } else { '[' });
            let mut count = 0;
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(&item, out)?;
                count += 1;
            }
            if tuple && count == 1 {
                out.push(',');
            }
            out.push(if tuple { ')' } else { ']' });
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(&key, out)?;
                out.push_str(": ");
                write_repr(&value.get_item(&key)?, out)?;
            }
            out.push('}');
        }
        _ => write!(out, "{value}").unwrap(),
    }
    Ok(())
}

/// `str(value)` as Python computes it for Jinja2's output.
pub fn to_str(value: &Value) -> Result<String, Error> {
    if let Some(s) = value.as_str() {
        return Ok(s.to_string());
    }
    let mut out = String::new();
    write_str_into(value, &mut out)?;
    Ok(out)
}

pub fn write_str(out: &mut minijinja::Output, value: &Value) -> Result<(), Error> {
    match value.as_str() {
        Some(s) => out.write_str(s),
        None => out.write_str(&to_str(value)?),
    }
    .map_err(|_| Error::new(minijinja::ErrorKind::WriteFailure, "could not write output"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (2.5, "2.5"),
            (-0.0, "-0.0"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.2345e22, "1.2345e+22"),
            (123456.789, "123456.789"),
            (f64::INFINITY, "inf"),
        ];
        for (x, want) in cases {
            assert_eq!(float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn strings_repr_with_python_quoting() {
        let mut out = String::new();
        string_repr("it's", &mut out);
        assert_eq!(out, "\"it's\"");
        out.clear();
        string_repr("a'b\"c\n\u{200d}", &mut out);
        assert_eq!(out, "'a\\'b\"c\\n\\u200d'");
    }
}
