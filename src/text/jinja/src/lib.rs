//! Renders Hugging Face chat templates with MiniJinja, configured the way transformers configures
//! Jinja2 in `utils/chat_template_utils.py`: trim_blocks, lstrip_blocks, no trailing newline, the
//! loopcontrols extension, `raise_exception`, `strftime_now`, and a `tojson` that is Python's
//! `json.dumps`. Python's string and dict methods come from minijinja-contrib's pycompat. Where
//! MiniJinja and Jinja2 differ on values a template prints or tests (float repr, list repr, what
//! counts as a sequence), this crate follows Python.
//!
//! One C entry point, `tt_jinja_render`, plus `tt_jinja_free` for the strings it returns.

use std::ffi::{c_char, CStr, CString};
use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use minijinja::value::ValueKind;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, UndefinedBehavior, Value};

mod pyjson;
mod pyrepr;

/// Status codes of `tt_jinja_render`.
const TT_OK: i32 = 0;
/// The template does not compile, or failed while rendering (the error names the line).
const TT_TEMPLATE_ERROR: i32 = 1;
/// The template called `raise_exception(message)`; the error is exactly that message.
const TT_RAISED: i32 = 2;
/// The context is not a JSON object, or an argument is not valid UTF-8.
const TT_BAD_INPUT: i32 = 3;

/// Jinja2's `{% generation %}` block (transformers' AssistantTracker extension) only marks the
/// assistant's text for masks; rendered plainly it outputs its body. An `{% if true %}` block tag
/// with the same whitespace modifiers renders identically, trim and lstrip rules included.
fn rewrite_generation_blocks(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (lead, body) = match inner.chars().next() {
            Some(c @ ('-' | '+')) => (c.to_string(), &inner[1..]),
            _ => (String::new(), inner),
        };
        let (body, trail) = match body.chars().last() {
            Some(c @ ('-' | '+')) => (&body[..body.len() - 1], c.to_string()),
            _ => (body, String::new()),
        };
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => write!(out, "{{%{lead} {r} {trail}%}}").unwrap(),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn json_to_value(v: serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(b),
        serde_json::Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                Value::from(u)
            } else if let Some(i) = n.as_i64() {
                Value::from(i)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s),
        serde_json::Value::Array(items) => {
            Value::from(items.into_iter().map(json_to_value).collect::<Vec<_>>())
        }
        serde_json::Value::Object(map) => Value::from_pairs(
            map.into_iter()
                .map(|(k, v)| (Value::from(k), json_to_value(v))),
        ),
    }
}

/// `strftime_now(format)`: the local time formatted by the C library's strftime, which is what
/// Python's `datetime.strftime` calls on Linux.
fn strftime_now(format: &str) -> Result<String, Error> {
    let fmt = CString::new(format)
        .map_err(|_| Error::new(ErrorKind::InvalidOperation, "strftime format contains NUL"))?;
    // SAFETY: time/localtime_r/strftime get valid pointers; the buffer length is passed.
    unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&now, &mut tm).is_null() {
            return Err(Error::new(ErrorKind::InvalidOperation, "localtime failed"));
        }
        let mut cap = 256usize;
        loop {
            let mut buf = vec![0u8; cap];
            let n = libc::strftime(buf.as_mut_ptr() as *mut c_char, cap, fmt.as_ptr(), &tm);
            if n > 0 || format.is_empty() || cap >= 1 << 16 {
                buf.truncate(n);
                return Ok(String::from_utf8_lossy(&buf).into_owned());
            }
            cap *= 8;
        }
    }
}

/// Jinja2's `sequence` test is true for anything with a length and item access: strings, lists,
/// dicts (and undefined). MiniJinja's is true for lists only.
fn is_sequence(v: &Value) -> bool {
    v.is_undefined()
        || matches!(
            v.kind(),
            ValueKind::Seq | ValueKind::String | ValueKind::Map
        )
}

/// Jinja2's `iterable` test is false for none, which MiniJinja iterates as empty.
fn is_iterable(v: &Value) -> bool {
    !v.is_none() && v.try_iter().is_ok()
}

fn build_environment(raised: Arc<Mutex<Option<String>>>) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .expect("default delimiters are valid"),
    );
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(|out, _state, value| pyrepr::write_str(out, value));
    env.add_filter("tojson", pyjson::tojson_filter);
    env.add_filter("string", |value: &Value| -> Result<Value, Error> {
        Ok(Value::from(pyrepr::to_str(value)?))
    });
    // Filters, tests and globals MiniJinja has and Jinja2 lacks: a template that uses them fails
    // in transformers, so it is refused here too.
    for name in ["split", "lines", "bool", "chain", "zip"] {
        env.remove_filter(name);
    }
    for name in ["int", "startingwith", "endingwith"] {
        env.remove_test(name);
    }
    env.remove_global("debug");
    env.add_test("sequence", is_sequence);
    env.add_test("iterable", is_iterable);
    env.add_function(
        "raise_exception",
        move |message: &Value| -> Result<Value, Error> {
            let text = pyrepr::to_str(message)?;
            *raised.lock().unwrap() = Some(text.clone());
            Err(Error::new(ErrorKind::InvalidOperation, text))
        },
    );
    env.add_function("strftime_now", |format: &str| strftime_now(format));
    env
}

fn render(source: &str, context_json: &str) -> Result<String, (i32, String)> {
    let context: serde_json::Value = serde_json::from_str(context_json).map_err(|e| {
        (
            TT_BAD_INPUT,
            format!("the template context is not valid JSON: {e}"),
        )
    })?;
    if !context.is_object() {
        return Err((
            TT_BAD_INPUT,
            "the template context must be a JSON object".to_string(),
        ));
    }
    let raised = Arc::new(Mutex::new(None));
    let env = build_environment(raised.clone());
    let source = rewrite_generation_blocks(source);
    let template = env
        .template_from_str(&source)
        .map_err(|e| (TT_TEMPLATE_ERROR, describe(&e)))?;
    template
        .render(json_to_value(context))
        .map_err(|e| match raised.lock().unwrap().take() {
            Some(message) => (TT_RAISED, message),
            None => (TT_TEMPLATE_ERROR, describe(&e)),
        })
}

/// The error and its causes on one line each, with the template line MiniJinja reports.
fn describe(err: &Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        write!(text, "; caused by: {cause}").unwrap();
        source = cause.source();
    }
    text
}

fn into_c_string(s: String) -> *mut c_char {
    // An error message crosses as a C string, which cannot hold a NUL; the rendered text, which
    // holds what the messages hold, crosses with its length instead.
    CString::new(s.replace('\0', "\u{FFFD}"))
        .unwrap()
        .into_raw()
}

/// Renders `source` with the variables of the JSON object `context_json`.
///
/// On success returns 0 and sets `*out` to the rendered UTF-8 bytes (NULs included, no
/// terminator) and `*out_len` to their count: free them with `tt_jinja_free_text`. Otherwise
/// returns a nonzero status (1 template error, 2 `raise_exception` called, 3 bad input) and sets
/// `*err`, a C string: free it with `tt_jinja_free`.
///
/// # Safety
/// `source` and `context_json` are NUL-terminated strings; `out`, `out_len` and `err` are valid
/// pointers.
#[no_mangle]
pub unsafe extern "C" fn tt_jinja_render(
    source: *const c_char,
    context_json: *const c_char,
    out: *mut *mut u8,
    out_len: *mut usize,
    err: *mut *mut c_char,
) -> i32 {
    *out = std::ptr::null_mut();
    *out_len = 0;
    *err = std::ptr::null_mut();
    let (Ok(source), Ok(context)) = (
        CStr::from_ptr(source).to_str(),
        CStr::from_ptr(context_json).to_str(),
    ) else {
        *err = into_c_string("the template or its context is not valid UTF-8".to_string());
        return TT_BAD_INPUT;
    };
    match catch_unwind(AssertUnwindSafe(|| render(source, context))) {
        Ok(Ok(text)) => {
            let bytes = text.into_bytes().into_boxed_slice();
            *out_len = bytes.len();
            *out = Box::into_raw(bytes).cast::<u8>();
            TT_OK
        }
        Ok(Err((code, message))) => {
            *err = into_c_string(message);
            code
        }
        Err(_) => {
            *err = into_c_string("internal error in the template engine".to_string());
            TT_TEMPLATE_ERROR
        }
    }
}

/// Frees an error message returned by `tt_jinja_render`.
///
/// # Safety
/// `s` is null or an `*err` of `tt_jinja_render`, not freed before.
#[no_mangle]
pub unsafe extern "C" fn tt_jinja_free(s: *mut c_char) {
    if !s.is_null() {
        drop(CString::from_raw(s));
    }
}

/// Frees rendered text returned by `tt_jinja_render`.
///
/// # Safety
/// `p` is null or an `*out` of `tt_jinja_render` with its `*out_len` as `len`, not freed before.
#[no_mangle]
pub unsafe extern "C" fn tt_jinja_free_text(p: *mut u8, len: usize) {
    if !p.is_null() {
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, len)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_blocks_become_if_blocks() {
        assert_eq!(
            rewrite_generation_blocks("a{%- generation %}b{% endgeneration -%}c{% if x %}"),
            "a{%- if true %}b{% endif -%}c{% if x %}"
        );
    }
}
