//! The `tojson` filter transformers registers: Python's
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, byte for
//! byte (Jinja2's own filter would escape `<`, `>`, `&` and `'`; MiniJinja's sorts keys).

use std::fmt::Write;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

use crate::pyrepr::{as_float, float_repr, to_str};

struct Options {
    ensure_ascii: bool,
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

fn type_error(message: String) -> Error {
    Error::new(ErrorKind::InvalidOperation, message)
}

fn python_type_name(value: &Value) -> &'static str {
    match value.kind() {
        ValueKind::Undefined => "Undefined",
        ValueKind::Bytes => "bytes",
        ValueKind::Iterable => "generator",
        _ => "object",
    }
}

fn write_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => write!(out, "\\u{:04x}", c as u32).unwrap(),
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    write!(out, "\\u{:04x}", unit).unwrap();
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn float_json(f: f64) -> String {
    if f.is_nan() {
        "NaN".to_string()
    } else if f.is_infinite() {
        if f < 0.0 { "-Infinity" } else { "Infinity" }.to_string()
    } else {
        float_repr(f)
    }
}

/// A dict key as json.dumps converts it: strings stay, numbers, booleans and None become text.
fn key_text(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_string()),
        ValueKind::None => Ok("null".to_string()),
        ValueKind::Number => Ok(match as_float(key) {
            Some(f) => float_json(f),
            None => to_str(key)?,
        }),
        _ => Err(type_error(format!(
            "keys must be str, int, float, bool or None, not {}",
            if key.is_tuple() {
                "tuple"
            } else {
                python_type_name(key)
            }
        ))),
    }
}

fn newline(opts: &Options, depth: usize, out: &mut String) {
    if let Some(indent) = &opts.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

fn write_value(value: &Value, opts: &Options, depth: usize, out: &mut String) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => match as_float(value) {
            Some(f) => out.push_str(&float_json(f)),
            None => write!(out, "{value}").unwrap(),
        },
        ValueKind::String => {
            write_string(value.as_str().unwrap_or_default(), opts.ensure_ascii, out)
        }
        ValueKind::Seq => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_separator);
                }
                newline(opts, depth + 1, out);
                write_value(item, opts, depth + 1, out)?;
            }
            newline(opts, depth, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((key_text(&key)?, item));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_separator);
                }
                newline(opts, depth + 1, out);
                write_string(key, opts.ensure_ascii, out);
                out.push_str(&opts.key_separator);
                write_value(item, opts, depth + 1, out)?;
            }
            newline(opts, depth, out);
            out.push('}');
        }
        _ => {
            return Err(type_error(format!(
                "Object of type {} is not JSON serializable",
                python_type_name(value)
            )))
        }
    }
    Ok(())
}

/// `indent` as json.dumps takes it: a number of spaces, or the indent text itself.
fn parse_indent(value: &Value) -> Result<Option<String>, Error> {
    match value.kind() {
        ValueKind::None | ValueKind::Undefined => Ok(None),
        ValueKind::String => Ok(Some(value.as_str().unwrap_or_default().to_string())),
        ValueKind::Number if value.is_integer() => {
            let n = i64::try_from(value.clone())?;
            Ok(Some(" ".repeat(n.max(0) as usize)))
        }
        _ => Err(type_error(format!(
            "tojson: indent must be an integer or a string, not {value}"
        ))),
    }
}

/// `tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, positionally or by
/// keyword as in transformers' filter.
pub fn tojson_filter(
    value: &Value,
    args: minijinja::value::Rest<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(type_error(format!(
            "tojson takes at most 4 arguments, got {}",
            args.len()
        )));
    }
    let mut given: [Value; 4] = Default::default();
    for (i, arg) in args.iter().enumerate() {
        given[i] = arg.clone();
    }
    for (i, name) in NAMES.iter().enumerate() {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            if i < args.len() {
                return Err(type_error(format!(
                    "tojson got multiple values for argument '{name}'"
                )));
            }
            given[i] = v;
        }
    }
    kwargs.assert_all_used()?;
    let indent = parse_indent(&given[1])?;
    let (item_separator, key_separator) = match given[2].kind() {
        ValueKind::None | ValueKind::Undefined => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
        _ => {
            let parts: Vec<Value> = given[2].try_iter()?.collect();
            match parts.as_slice() {
                [item, key] if item.as_str().is_some() && key.as_str().is_some() => (
                    item.as_str().unwrap().to_string(),
                    key.as_str().unwrap().to_string(),
                ),
                _ => {
                    return Err(type_error(
                        "tojson: separators must be two strings".to_string(),
                    ))
                }
            }
        }
    };
    let opts = Options {
        ensure_ascii: given[0].is_true(),
        indent,
        item_separator,
        key_separator,
        sort_keys: given[3].is_true(),
    };
    let mut out = String::new();
    write_value(value, &opts, 0, &mut out)?;
    Ok(Value::from(out))
}
