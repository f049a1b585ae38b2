//! kubectl_complete-ax: what kubectl (1.26 and later) runs for `kubectl ax <TAB>`, with the words
//! after `ax`. Prints the candidates and cobra's directive line; all logic lives in
//! `ax::cli::complete`.

use std::io::Write;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let words: Vec<String> = std::env::args().skip(1).collect();
    let answer = ax::cli::complete::run(&words).await;
    // A closed pipe ends completion; nothing to report to a shell.
    let _ = std::io::stdout().lock().write_all(answer.as_bytes());
}
