//! Text output of `kubectl ax` (no client required): kubectl-style tables, and names as lists
//! show them. Times and durations are in `client::format`, shared with the console.

use crate::client::format::NONE;

/// Columns like `kubectl get`: upper-case headers, left-aligned, three spaces apart, no borders.
/// The last column is not padded, so lines carry no trailing blanks.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let widths = widths(headers, rows);
    let mut out = String::new();
    if !headers.is_empty() {
        let header_row: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
        out.push_str(&line(&header_row, &widths));
    }
    for row in rows {
        out.push_str(&line(row, &widths));
    }
    out
}

/// Rows without a header line, aligned as if `headers` were there (for `--no-headers`).
pub fn table_without_headers(headers: &[&str], rows: &[Vec<String>]) -> String {
    let text = table(headers, rows);
    text.split_once('\n')
        .map(|(_, rest)| rest.to_string())
        .unwrap_or_default()
}

/// The width of each column: its widest cell or header.
pub fn widths(headers: &[&str], rows: &[Vec<String>]) -> Vec<usize> {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            let len = cell_text(cell).chars().count();
            match widths.get_mut(i) {
                Some(w) => *w = (*w).max(len),
                None => widths.push(len),
            }
        }
    }
    widths
}

/// One row padded to `widths`, with its newline (a wider cell just pushes the rest right, as in
/// `kubectl get -w`).
pub fn line(row: &[String], widths: &[usize]) -> String {
    let mut line = String::new();
    for (i, cell) in row.iter().enumerate() {
        let cell = cell_text(cell);
        line.push_str(cell);
        if i + 1 < row.len() {
            let width = widths.get(i).copied().unwrap_or(0);
            let pad = width.saturating_sub(cell.chars().count());
            line.push_str(&" ".repeat(pad + 3));
        }
    }
    let mut line = line.trim_end().to_string();
    line.push('\n');
    line
}

/// A task's namespace and name as `ns/name`, or just the name when only one namespace is shown.
pub fn qualified_name(namespace: Option<&str>, name: &str, all_namespaces: bool) -> String {
    match namespace {
        Some(ns) if all_namespaces => format!("{ns}/{name}"),
        _ => name.to_owned(),
    }
}

fn cell_text(cell: &str) -> &str {
    if cell.is_empty() { NONE } else { cell }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_without_trailing_blanks() {
        let text = table(
            &["NAME", "PHASE", "AGE"],
            &[
                vec!["a".into(), "Running".into(), "5s".into()],
                vec!["longer-name".into(), "".into(), "12m".into()],
            ],
        );
        assert_eq!(
            text,
            "NAME          PHASE     AGE\n\
             a             Running   5s\n\
             longer-name   -         12m\n"
        );
        assert!(text.lines().all(|l| !l.ends_with(' ')));
        assert_eq!(
            table_without_headers(&["NAME", "PHASE"], &[vec!["a".into(), "b".into()]]),
            "a      b\n"
        );
    }
}
