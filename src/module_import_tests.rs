//! No import circle between the crate's top-level modules (issue 26): every `crate::MODULE`
//! reference in `src/**/*.rs` (and every `super::` path that climbs out of its module) is an edge
//! from the file's top-level module to MODULE; the test fails on any cycle among them, naming the
//! references that make it. A layer that imports back from the one above it cannot be read, or
//! moved, on its own.
//!
//! Run by `cargo test --lib`, so CI runs it with the unit tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Back edges that exist today. Each must still exist (else delete it here), and the graph
/// without them must have no cycle.
const KNOWN_BACK_EDGES: &[(&str, &str)] = &[];

/// `from → to`, with where each reference is (file:line).
type Graph = BTreeMap<(String, String), Vec<String>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under `src/`: `cli/args.rs` → [cli, args], `console/pages/mod.rs`
/// → [console, pages]; None for the crate root and the binaries (they use `ax::`, not `crate::`).
fn module_path(relative: &Path) -> Option<Vec<String>> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let file = parts.pop()?;
    let crate_root = parts.is_empty() && matches!(file.as_str(), "lib.rs" | "main.rs");
    if crate_root || parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    let stem = file.strip_suffix(".rs")?.to_owned();
    if stem != "mod" {
        parts.push(stem);
    }
    Some(parts)
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn ident_at(text: &str) -> &str {
    let end = text.find(|c| !is_ident_char(c)).unwrap_or(text.len());
    &text[..end]
}

/// The first identifier of each item of a `{a::b, c, d::{e}}` group at the start of `text`.
fn group_heads(text: &str) -> Vec<&str> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut item_start = true;
    for (i, c) in text.char_indices() {
        match c {
            '{' => {
                depth += 1;
                item_start = depth == 1;
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => item_start = true,
            c if c.is_whitespace() => {}
            _ if item_start && depth == 1 => {
                heads.push(ident_at(&text[i..]));
                item_start = false;
            }
            _ => {}
        }
    }
    heads
}

/// Each top-level module the source refers to, with the byte offset of the reference: `crate::X`
/// and `crate::{X, Y::Z}`, and `super::` paths that climb to the crate root from `module`.
fn referenced_modules(source: &str, module: &[String]) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    // Not `$crate::` (macros) or `pub(crate)`.
    for (i, _) in source.match_indices("crate::") {
        if source[..i]
            .chars()
            .next_back()
            .is_some_and(|c| is_ident_char(c) || c == '$')
        {
            continue;
        }
        let rest = &source[i + "crate::".len()..];
        if rest.starts_with('{') {
            found.extend(group_heads(rest).into_iter().map(|m| (i, m.to_owned())));
        } else {
            found.push((i, ident_at(rest).to_owned()));
        }
    }
    // Counted from the file's own module: inside an inline `mod tests` a `super::` climbs one
    // level less, which only names a top-level module when a child shares its name.
    for (i, _) in source.match_indices("super::") {
        if source[..i].ends_with("super::")
            || source[..i].chars().next_back().is_some_and(is_ident_char)
        {
            continue;
        }
        let mut rest = &source[i..];
        let mut ups = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            ups += 1;
            rest = r;
        }
        if ups == module.len() {
            found.push((i, ident_at(rest).to_owned()));
        }
    }
    found
}

/// The source without `//` comments (doc comments name paths in prose), lines kept in place.
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|l| {
            if l.trim_start().starts_with("//") {
                ""
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn import_graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: Vec<(PathBuf, Vec<String>)> = files
        .into_iter()
        .filter_map(|f| {
            let module = module_path(f.strip_prefix(src).expect("under src"))?;
            Some((f, module))
        })
        .collect();
    let top_level: BTreeSet<&String> = modules.iter().filter_map(|(_, m)| m.first()).collect();
    let mut graph = Graph::new();
    for (file, module) in &modules {
        let top = &module[0];
        let source = without_comments(&std::fs::read_to_string(file).expect("readable source"));
        for (offset, to) in referenced_modules(&source, module) {
            if &to != top && top_level.contains(&to) {
                let line = source[..offset].matches('\n').count() + 1;
                let place = format!(
                    "{}:{line}",
                    file.strip_prefix(src).expect("under src").display()
                );
                graph
                    .entry((top.clone(), to))
                    .or_default()
                    .push(format!("src/{place}"));
            }
        }
    }
    graph
}

/// Every cycle's modules, each cycle once (as the strongly connected components of more than one
/// module).
fn cycles(edges: &BTreeSet<(String, String)>) -> Vec<BTreeSet<String>> {
    let nodes: BTreeSet<&String> = edges.iter().flat_map(|(a, b)| [a, b]).collect();
    let reaches = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for (a, b) in edges {
                if *a == n && seen.insert(b.clone()) {
                    todo.push(b.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reaches(n))).collect();
    let mut components: Vec<BTreeSet<String>> = Vec::new();
    for n in &nodes {
        let component: BTreeSet<String> = nodes
            .iter()
            .filter(|m| reach[*n].contains(**m) && reach[**m].contains(*n))
            .map(|m| (*m).clone())
            .collect();
        if component.len() > 1 && !components.contains(&component) {
            components.push(component);
        }
    }
    components
}

#[test]
fn no_top_level_module_imports_back_from_one_that_imports_it() {
    let graph = import_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let mut edges: BTreeSet<(String, String)> = graph.keys().cloned().collect();
    let mut problems = Vec::new();
    for (from, to) in KNOWN_BACK_EDGES {
        if !edges.remove(&(from.to_string(), to.to_string())) {
            problems.push(format!(
                "{from} no longer imports {to}: delete it from KNOWN_BACK_EDGES"
            ));
        }
    }
    for cycle in cycles(&edges) {
        let mut text = format!("import circle among {cycle:?}:");
        for ((from, to), places) in &graph {
            if cycle.contains(from)
                && cycle.contains(to)
                && edges.contains(&(from.clone(), to.clone()))
            {
                text.push_str(&format!("\n  {from} -> {to}: {}", places.join(", ")));
            }
        }
        problems.push(text);
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn references_are_read_from_use_lines_and_paths() {
    let cli_args = ["cli".to_string(), "args".to_string()];
    let modules = |source: &str| -> Vec<String> {
        referenced_modules(source, &cli_args)
            .into_iter()
            .map(|(_, m)| m)
            .collect()
    };
    assert_eq!(modules("use crate::core::task::{a, b};"), ["core"]);
    assert_eq!(
        modules("use crate::{\n    api::AxTask,\n    core::{x, y},\n};"),
        ["api", "core"]
    );
    assert_eq!(
        modules("x = crate::console::run(ctx).await; $crate::y; pub(crate) z"),
        ["console"]
    );
    assert_eq!(modules("use super::super::api::X;"), ["api"]);
    assert!(modules("use super::ctx::Ctx;").is_empty());
    assert_eq!(without_comments("a\n  /// crate::x\nb"), "a\n\nb");
    assert_eq!(
        module_path(Path::new("console/pages/mod.rs")),
        Some(vec!["console".to_string(), "pages".to_string()])
    );
    assert_eq!(module_path(Path::new("lib.rs")), None);
    assert_eq!(module_path(Path::new("bin/kubectl-ax.rs")), None);
}

#[test]
fn a_circle_of_any_length_is_found_once() {
    let edges: BTreeSet<(String, String)> = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let found = cycles(&edges);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0], ["a", "b", "c"].map(String::from).into());
}
