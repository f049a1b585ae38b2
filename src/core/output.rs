//! A worker's output: what it writes to `$AX_OUTPUT_FILE`, read back from its pod's status.
//!
//! `$AX_OUTPUT_FILE` is the main container's termination-message file (`/dev/termination-log`
//! unless the template sets `terminationMessagePath`). The kubelet copies that file into the pod's
//! status when the container exits, so the output survives the container, a kubelet restart and
//! the operator's own restarts with nothing more in the pod: no sidecar, no `pods/exec`, no log
//! read (Kubernetes 1.20 has no native sidecars to copy a larger file out before the pod ends).
//! The price is the kubelet's limit: it keeps the last 4096 bytes of the file. An output must
//! therefore be at most 4095 bytes; a message of the full 4096 bytes is taken as cut.
//!
//! The same file carries a failed worker's error (`{"error":"biz"}`): it is an output only when
//! the main container exited 0.

use serde_json::Value;

/// The variable a worker finds its output file's path in.
pub const OUTPUT_FILE_ENV: &str = "AX_OUTPUT_FILE";
/// A container's termination-message file when its template names none (the API server's
/// default).
pub const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";
/// What the kubelet keeps of a termination message: its last this many bytes.
pub const TERMINATION_MESSAGE_KEPT_BYTES: usize = 4096;
/// The largest output: a kept message of [`TERMINATION_MESSAGE_KEPT_BYTES`] may have been cut.
pub const MAX_OUTPUT_BYTES: usize = TERMINATION_MESSAGE_KEPT_BYTES - 1;

/// What a succeeded worker's termination message gives.
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    /// It wrote nothing (or only whitespace).
    None,
    /// JSON, or text that is no JSON as a string.
    Some(Value),
    /// More than [`MAX_OUTPUT_BYTES`]: the kubelet kept only its end.
    TooLarge,
}

/// The output of a worker whose main container exited 0 with termination message `message`.
pub fn of_message(message: &str) -> Output {
    if message.len() > MAX_OUTPUT_BYTES {
        return Output::TooLarge;
    }
    // `echo '{"n":1}' > $AX_OUTPUT_FILE` ends in a newline.
    let text = message.trim();
    if text.is_empty() {
        return Output::None;
    }
    match serde_json::from_str(text) {
        Ok(value) => Output::Some(value),
        Err(_) => Output::Some(Value::String(text.to_owned())),
    }
}

/// The value at `path` (field names joined by `.`; empty: the whole value) in `value`.
pub fn at_path<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    if path.is_empty() {
        return Some(value);
    }
    path.split('.').try_fold(value, |v, field| v.get(field))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn json_is_the_output_and_text_is_kept_as_a_string() {
        assert_eq!(of_message(""), Output::None);
        assert_eq!(of_message(" \n"), Output::None);
        assert_eq!(
            of_message("{\"orders\": [1, 2]}\n"),
            Output::Some(json!({"orders": [1, 2]}))
        );
        assert_eq!(of_message("[1,2,3]"), Output::Some(json!([1, 2, 3])));
        assert_eq!(of_message("42"), Output::Some(json!(42)));
        assert_eq!(of_message("done\n"), Output::Some(json!("done")));
    }

    #[test]
    fn a_message_the_kubelet_may_have_cut_is_too_large() {
        let most = format!("\"{}\"", "x".repeat(MAX_OUTPUT_BYTES - 2));
        assert_eq!(most.len(), MAX_OUTPUT_BYTES);
        assert!(matches!(of_message(&most), Output::Some(_)));
        let kept = format!("\"{}\"", "x".repeat(MAX_OUTPUT_BYTES - 1));
        assert_eq!(kept.len(), TERMINATION_MESSAGE_KEPT_BYTES);
        assert_eq!(of_message(&kept), Output::TooLarge);
    }

    #[test]
    fn paths_name_fields_of_objects() {
        let value = json!({"a": {"b": [1, 2]}, "c": 3});
        assert_eq!(at_path(&value, ""), Some(&value));
        assert_eq!(at_path(&value, "a.b"), Some(&json!([1, 2])));
        assert_eq!(at_path(&value, "c"), Some(&json!(3)));
        assert_eq!(at_path(&value, "a.x"), None);
        assert_eq!(at_path(&value, "c.d"), None);
    }

    proptest! {
        /// Whatever a worker writes, the output is decided without a panic, and nothing over the
        /// limit is ever taken as an output.
        #[test]
        fn any_message_gives_an_output_within_the_limit(message in ".{0,5000}") {
            match of_message(&message) {
                Output::TooLarge => prop_assert!(message.len() > MAX_OUTPUT_BYTES),
                Output::None => prop_assert!(message.trim().is_empty()),
                Output::Some(_) => prop_assert!(message.len() <= MAX_OUTPUT_BYTES),
            }
        }
    }
}
