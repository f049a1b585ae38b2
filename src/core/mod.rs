//! Every decision of the operator as plain functions over plain data: no client, no clock, no
//! randomness of their own. Tested exhaustively; the controllers only gather inputs and write.

pub mod archive;
pub mod backoff;
pub mod conditions;
pub mod cron;
pub mod dag;
pub mod egress;
pub mod election;
pub mod output;
pub mod queue;
pub mod selector;
pub mod task;
pub mod template;
pub mod trace;
pub mod worker;

/// Bytes as lowercase hex, two digits each (digests in names, trace ids, tokens).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
