//! The documentation holds together: every link in README.md, docs/, examples/README.md and the
//! chart's README points at a file of this repository (and, with `#anchor`, at one of its
//! headings), none points outside the repository, and the README stays a front door, not the
//! manual. No cluster needed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The README's size limit: what ax is, the quick starts and an index. The rest is in docs/.
const README_MAX_LINES: usize = 260;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files a reader reaches from the README.
fn documents() -> Vec<PathBuf> {
    let root = repo_root();
    let mut files = vec![
        root.join("README.md"),
        root.join("examples/README.md"),
        root.join("charts/ax-operator/README.md"),
    ];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The text outside fenced code blocks and inline code spans: a `](x)` in a shell snippet is not
/// a link.
fn prose(markdown: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                out.push(c);
            }
        }
        out.push('\n');
    }
    out
}

/// The targets of inline links and images, `[text](target)` and `![alt](target)`.
fn link_targets(markdown: &str) -> Vec<String> {
    let text = prose(markdown);
    let mut targets = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let end = rest.find(')').unwrap_or(rest.len());
        let target = rest[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.to_string());
        rest = &rest[end..];
    }
    targets
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// What is wrong with one link of `from`, if anything.
fn broken(from: &Path, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") || target.starts_with("//") {
        return Some("points outside the repository".into());
    }
    let (path, fragment) = match target.split_once('#') {
        Some((path, fragment)) => (path, Some(fragment)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        from.to_path_buf()
    } else {
        from.parent().expect("a file's directory").join(path)
    };
    if !file.exists() {
        return Some(format!("{} does not exist", file.display()));
    }
    if let Some(fragment) = fragment
        && file.extension().is_some_and(|ext| ext == "md")
    {
        let text = std::fs::read_to_string(&file).expect("a linked Markdown file");
        if !anchors(&text).contains(fragment) {
            return Some(format!("{} has no heading #{fragment}", file.display()));
        }
    }
    None
}

#[test]
fn every_link_of_the_docs_points_into_the_repository_and_resolves() {
    let mut problems = Vec::new();
    for file in documents() {
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for target in link_targets(&text) {
            if let Some(problem) = broken(&file, &target) {
                problems.push(format!("{}: link {target}: {problem}", file.display()));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_readme_is_a_front_door_that_links_every_doc() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines; move detail into docs/ (at most {README_MAX_LINES})"
    );
    let linked: BTreeSet<String> = link_targets(&readme).into_iter().collect();
    for file in documents()
        .iter()
        .filter(|f| f.parent().is_some_and(|d| d.ends_with("docs")))
    {
        let name = format!("docs/{}", file.file_name().unwrap().to_string_lossy());
        assert!(linked.contains(&name), "README.md does not link {name}");
    }
}

#[test]
fn the_link_checker_sees_links_and_anchors_as_github_does() {
    assert_eq!(
        link_targets(
            "see [a](docs/a.md#x \"title\") and `[no](link)`\n```\n[no](fence)\n```\n![img](p.png)"
        ),
        vec!["docs/a.md#x", "p.png"]
    );
    assert_eq!(
        anchor(" Monitoring: Prometheus, alerts, a Grafana dashboard"),
        "monitoring-prometheus-alerts-a-grafana-dashboard"
    );
    assert_eq!(
        anchor(" `kubectl ax`: the console"),
        "kubectl-ax-the-console"
    );
    let here = repo_root().join("README.md");
    assert!(broken(&here, "https://example.com").is_some());
    assert!(broken(&here, "docs/no-such-file.md").is_some());
    assert!(broken(&here, "#no-such-heading").is_some());
    assert_eq!(broken(&here, "#layout"), None);
}
