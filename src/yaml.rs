//! YAML in and out, in one place so every reader and writer agrees on the dialect.
//!
//! The crate is serde-saphyr: maintained, and already built in for kube's kubeconfig reader.
//! Reading follows what serde_yaml (which this replaced) read: YAML 1.2 core types, so `yes`,
//! `0755` and `1_000` stay strings in untyped values. Writing quotes every string that a YAML
//! 1.1 reader (kubectl, helm) would take for another type. Errors are one line naming the line
//! and column: they are shown inside other messages.
//!
//! There is no YAML value type: untyped documents are `serde_json::Value`, which is what the
//! API server speaks anyway.

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use serde_saphyr::{DeserializeError, SerializeError};

fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        with_snippet: false,
    }
}

/// One YAML (or JSON) document.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, DeserializeError> {
    serde_saphyr::from_str_with_options(text, options())
}

/// Every document of a `---`-separated stream, empty ones (only comments, or nothing between
/// two `---`) left out, as `helm template` writes them.
pub fn documents<T: DeserializeOwned>(text: &str) -> Result<Vec<T>, DeserializeError> {
    let documents: Vec<Option<T>> = serde_saphyr::from_multiple_with_options(text, options())?;
    Ok(documents.into_iter().flatten().collect())
}

/// A document as block YAML. Strings with line breaks are literal blocks (`|`); long ones stay
/// on one line, as before, rather than folded (`>`) at 80 columns.
pub fn to_string<T: Serialize>(value: &T) -> Result<String, SerializeError> {
    let options = serde_saphyr::ser_options! { folded_wrap_chars: usize::MAX };
    serde_saphyr::to_string_with_options(value, options)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn untyped_scalars_are_read_as_yaml_1_2_core() {
        let value: Value = from_str(
            "a: yes\nb: on\nc: 0755\nd: 1_000\ne: true\nf: 12\ng: 1.5\nh: ~\ni: '12'\nj: 0x1F\n",
        )
        .expect("YAML");
        assert_eq!(
            value,
            json!({"a": "yes", "b": "on", "c": "0755", "d": "1_000", "e": true, "f": 12,
                   "g": 1.5, "h": null, "i": "12", "j": 31})
        );
    }

    #[test]
    fn json_is_yaml() {
        let value: Value = from_str(r#"{"a": [1, "x"], "b": {"c": null}}"#).expect("JSON");
        assert_eq!(value, json!({"a": [1, "x"], "b": {"c": null}}));
    }

    #[test]
    fn a_bad_document_is_one_line_naming_the_line() {
        let problem = from_str::<Value>("a: 1\nb: [\n").expect_err("not YAML");
        let message = problem.to_string();
        assert!(!message.trim_end().contains('\n'), "{message}");
        assert!(message.contains("line"), "{message}");
        let problem = from_str::<Value>("a: 1\na: 2\n").expect_err("a duplicate key");
        assert!(problem.to_string().contains("line 2"), "{problem}");
    }

    #[test]
    fn empty_documents_of_a_stream_are_left_out() {
        let text = "---\n# Source: a.yaml\n---\nkind: A\n---\n---\nkind: B\n";
        let docs: Vec<Value> = documents(text).expect("YAML");
        assert_eq!(docs, vec![json!({"kind": "A"}), json!({"kind": "B"})]);
    }

    #[test]
    fn what_is_written_reads_back_the_same_and_ambiguous_strings_are_quoted() {
        let value = json!({
            "strings": ["yes", "no", "on", "off", "y", "n", "true", "null", "~", "12", "0755",
                        "1e3", "1_000", "0x1F", "", " lead", "trail ", "a: b", "- x", "#c",
                        "2001-12-14", "12:30:00", "*", "&a", "!t", "%p", "@", "`"],
            "multi": "line one\nline two\n",
            "multi_no_end": "line one\n  indented\nlast",
            "long": "word ".repeat(40),
            "numbers": [0, -1, 1.5, 1e100, u64::MAX],
            "empty": {"map": {}, "list": []},
            "nested": [{"a": [{"b": null}]}],
        });
        let text = to_string(&value).expect("YAML");
        let back: Value = from_str(&text).expect("reads back");
        assert_eq!(back, value, "{text}");
        for word in ["yes", "no", "on", "off", "y", "n", "true", "null", "12"] {
            assert!(
                text.contains(&format!("'{word}'")) || text.contains(&format!("\"{word}\"")),
                "{word} is quoted:\n{text}"
            );
        }
    }
}
