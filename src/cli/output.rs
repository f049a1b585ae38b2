//! `-o` of the read verbs, as kubectl has it (no client required): `wide`, `json`, `yaml`,
//! `name`, and `jsonpath=TEMPLATE` in kubectl's template syntax (`{.a.b}`, text between,
//! `{"\n"}`, `{range .items[*]}...{end}`), the paths evaluated by jsonpath-rust (RFC 9535).

use std::io::Write;
use std::str::FromStr;

use jsonpath_rust::JsonPath;
use kube::ResourceExt;
use serde::Serialize;
use serde_json::Value;

use crate::client::error::ClientError;

use super::list::{list_document, object_name, to_json, to_yaml};

/// A value of `-o`.
#[derive(Clone, Debug, PartialEq)]
pub enum OutputFormat {
    Wide,
    Json,
    Yaml,
    Name,
    JsonPath(Template),
}

impl FromStr for OutputFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "wide" => Ok(OutputFormat::Wide),
            "json" => Ok(OutputFormat::Json),
            "yaml" => Ok(OutputFormat::Yaml),
            "name" => Ok(OutputFormat::Name),
            _ => match text.split_once('=') {
                Some(("jsonpath", template)) => {
                    Template::parse(template).map(OutputFormat::JsonPath)
                }
                _ => Err(format!(
                    "{text:?}: one of wide, json, yaml, name, jsonpath=TEMPLATE"
                )),
            },
        }
    }
}

/// A parsed kubectl JSONPath template.
#[derive(Clone, Debug, PartialEq)]
pub struct Template(Vec<Node>);

#[derive(Clone, Debug, PartialEq)]
enum Node {
    Text(String),
    /// An RFC 9535 path, `$`-rooted at the current value.
    Path(String),
    Range(String, Vec<Node>),
}

/// kubectl's paths start at `.` (or `$`, or `@` inside a range); RFC 9535's at `$`.
fn rooted(expr: &str) -> String {
    if let Some(rest) = expr.strip_prefix('@') {
        format!("${rest}")
    } else if expr.starts_with('$') {
        expr.to_owned()
    } else if expr.starts_with('.') || expr.starts_with('[') {
        format!("${expr}")
    } else {
        format!("$.{expr}")
    }
}

/// A `"..."` literal's text, with kubectl's escapes.
fn unquote(literal: &str) -> Result<String, String> {
    let inner = literal
        .strip_prefix('"')
        .and_then(|l| l.strip_suffix('"'))
        .ok_or_else(|| format!("unterminated string {literal}"))?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    Ok(out)
}

impl Template {
    pub fn parse(text: &str) -> Result<Template, String> {
        let bad = |why: String| format!("jsonpath template {text:?}: {why}");
        // A stack of open ranges: (path, nodes so far); the bottom one is the template.
        let mut stack: Vec<(String, Vec<Node>)> = vec![(String::new(), Vec::new())];
        let mut rest = text;
        while !rest.is_empty() {
            let Some(open) = rest.find('{') else {
                let top = &mut stack.last_mut().expect("the template").1;
                top.push(Node::Text(rest.to_owned()));
                break;
            };
            if open > 0 {
                let top = &mut stack.last_mut().expect("the template").1;
                top.push(Node::Text(rest[..open].to_owned()));
            }
            // The closing brace outside a string literal.
            let mut in_string = false;
            let mut escaped = false;
            let mut close = None;
            for (i, c) in rest[open + 1..].char_indices() {
                match c {
                    _ if escaped => escaped = false,
                    '\\' if in_string => escaped = true,
                    '"' => in_string = !in_string,
                    '}' if !in_string => {
                        close = Some(open + 1 + i);
                        break;
                    }
                    _ => {}
                }
            }
            let close = close.ok_or_else(|| bad("unclosed {".into()))?;
            let expr = rest[open + 1..close].trim();
            rest = &rest[close + 1..];
            if expr.starts_with('"') {
                let literal = unquote(expr).map_err(bad)?;
                stack
                    .last_mut()
                    .expect("the template")
                    .1
                    .push(Node::Text(literal));
            } else if let Some(path) = expr.strip_prefix("range ") {
                stack.push((rooted(path.trim()), Vec::new()));
            } else if expr == "end" {
                if stack.len() < 2 {
                    return Err(bad("{end} without {range}".into()));
                }
                let (path, nodes) = stack.pop().expect("a range");
                stack
                    .last_mut()
                    .expect("the template")
                    .1
                    .push(Node::Range(path, nodes));
            } else if expr.is_empty() {
                return Err(bad("empty {}".into()));
            } else {
                let path = rooted(expr);
                // Checked now, so that a bad path is a usage error before any request.
                Value::Null
                    .query(&path)
                    .map_err(|e| bad(format!("{expr}: {e}")))?;
                stack
                    .last_mut()
                    .expect("the template")
                    .1
                    .push(Node::Path(path));
            }
        }
        if stack.len() > 1 {
            return Err(bad("{range} without {end}".into()));
        }
        Ok(Template(stack.pop().expect("the template").1))
    }

    /// The template applied to `value`. As for kubectl get, a missing key prints nothing;
    /// several results are joined by a space, strings without quotes, the rest as JSON.
    pub fn render(&self, value: &Value) -> Result<String, ClientError> {
        let mut out = String::new();
        render_nodes(&self.0, value, &mut out)?;
        Ok(out)
    }
}

fn query<'a>(path: &str, value: &'a Value) -> Result<Vec<&'a Value>, ClientError> {
    value
        .query(path)
        .map_err(|e| ClientError::Usage(format!("jsonpath {path}: {e}")))
}

fn render_nodes(nodes: &[Node], value: &Value, out: &mut String) -> Result<(), ClientError> {
    for node in nodes {
        match node {
            Node::Text(text) => out.push_str(text),
            Node::Path(path) => {
                let texts: Vec<String> = query(path, value)?
                    .into_iter()
                    .map(|v| match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                    .collect();
                out.push_str(&texts.join(" "));
            }
            Node::Range(path, body) => {
                for item in query(path, value)? {
                    render_nodes(body, item, out)?;
                }
            }
        }
    }
    Ok(())
}

/// Writes `items` in a machine format: one object as itself when `single`, else a kubectl
/// `List`. False for the table formats (none, `wide`): the caller draws its table.
pub fn write_objects<T>(
    out: &mut impl Write,
    format: Option<&OutputFormat>,
    kind: &str,
    items: &[T],
    single: bool,
) -> Result<bool, ClientError>
where
    T: Serialize + kube::Resource,
{
    let document = || -> Result<Value, ClientError> {
        match (single, items) {
            (true, [one]) => serde_json::to_value(one).map_err(|e| ClientError::Io(e.to_string())),
            _ => Ok(list_document(items)),
        }
    };
    match format {
        None | Some(OutputFormat::Wide) => return Ok(false),
        Some(OutputFormat::Json) => out.write_all(to_json(&document()?)?.as_bytes())?,
        Some(OutputFormat::Yaml) => out.write_all(to_yaml(&document()?)?.as_bytes())?,
        Some(OutputFormat::Name) => {
            for item in items {
                writeln!(out, "{}", object_name(kind, &item.name_any()))?;
            }
        }
        Some(OutputFormat::JsonPath(template)) => {
            out.write_all(template.render(&document()?)?.as_bytes())?
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list() -> Value {
        serde_json::json!({"kind": "List", "items": [
            {"metadata": {"name": "a", "labels": {"team": "x"}}, "status": {"phase": "Dead", "attempt": 2}},
            {"metadata": {"name": "b"}, "status": {"phase": "Succeeded", "attempt": 1}},
        ]})
    }

    fn render(template: &str, value: &Value) -> String {
        Template::parse(template).unwrap().render(value).unwrap()
    }

    #[test]
    fn kubectl_templates_select_join_and_range() {
        let v = list();
        assert_eq!(render("{.items[*].metadata.name}", &v), "a b");
        assert_eq!(render("{.items[0].status.attempt}", &v), "2");
        assert_eq!(render("kind={.kind}", &v), "kind=List");
        assert_eq!(
            render(
                r#"{range .items[*]}{.metadata.name}{"\t"}{.status.phase}{"\n"}{end}"#,
                &v
            ),
            "a\tDead\nb\tSucceeded\n"
        );
        assert_eq!(
            render("{.items[?(@.status.phase=='Dead')].metadata.name}", &v),
            "a"
        );
        assert_eq!(
            render(
                r#"{.items[?(@.status.phase=="Succeeded")].metadata.name}"#,
                &v
            ),
            "b"
        );
        assert_eq!(render("{.items[0].metadata.labels}", &v), r#"{"team":"x"}"#);
        assert_eq!(render("{$.kind}", &v), "List");
        // As kubectl get: a missing key prints nothing.
        assert_eq!(render("{.nope}", &v), "");
    }

    #[test]
    fn bad_templates_are_usage_errors_up_front() {
        for bad in [
            "{.a",
            "{range .items[*]}x",
            "{end}",
            "{}",
            r#"{"open}"#,
            "{.a[}",
        ] {
            assert!(Template::parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn formats_parse_as_kubectl_spells_them() {
        assert_eq!("wide".parse::<OutputFormat>(), Ok(OutputFormat::Wide));
        assert_eq!("name".parse::<OutputFormat>(), Ok(OutputFormat::Name));
        assert!(matches!(
            "jsonpath={.a}".parse::<OutputFormat>(),
            Ok(OutputFormat::JsonPath(_))
        ));
        assert!("table".parse::<OutputFormat>().is_err());
    }

    #[test]
    fn one_object_is_itself_and_several_a_list() {
        let task = crate::client::task::fixtures::dead_task(serde_json::json!([]));
        let path = OutputFormat::JsonPath(Template::parse("{.metadata.name}").unwrap());
        let mut out = Vec::new();
        assert!(
            write_objects(
                &mut out,
                Some(&path),
                "axtask",
                std::slice::from_ref(&task),
                true
            )
            .unwrap()
        );
        assert_eq!(String::from_utf8(out).unwrap(), "flaky");
        let mut out = Vec::new();
        let items = [task.clone(), task];
        write_objects(&mut out, Some(&OutputFormat::Json), "axtask", &items, false).unwrap();
        let doc: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(doc["items"].as_array().unwrap().len(), 2);
        let mut out = Vec::new();
        write_objects(
            &mut out,
            Some(&OutputFormat::Name),
            "axtask",
            &items[..1],
            false,
        )
        .unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "axtask.ax.dev/flaky\n");
        assert!(
            !write_objects(
                &mut Vec::new(),
                Some(&OutputFormat::Wide),
                "axtask",
                &items,
                false
            )
            .unwrap()
        );
    }
}
