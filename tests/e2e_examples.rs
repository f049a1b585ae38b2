//! Every file in examples/ is applied to the real cluster and reaches the outcome its header
//! promises. The promise is machine-readable, one `# expect:` line each, so a reader sees what the
//! test checks:
//!
//! - `# expect: KIND/NAME {JSONPATH} = VALUE` — `kubectl get -o jsonpath` prints VALUE (in time);
//!   `!=` instead: prints anything else (`!= ` with nothing after it: is set);
//! - `# expect: KIND/NAME deleted` — the object was created and is gone again;
//! - `# expect: rejected TEXT` — the API server refuses the file, saying TEXT;
//! - `# expect: KIND/NAME matches` — the file shows an object that exists already (the `default`
//!   queue): every field of its spec is the live object's. Such a file is not applied.
//!
//! Each example gets its own namespace; what it created is deleted afterwards (a cron firing every
//! minute must not outlive the test).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{repo_root, run_kubectl};

/// Generous: the slowest example (a cron's first firing, then its child) needs about 90 s.
const DEADLINE: Duration = Duration::from_secs(300);

#[derive(Debug, PartialEq)]
enum Expect {
    Equals {
        object: String,
        path: String,
        value: String,
    },
    Differs {
        object: String,
        path: String,
        value: String,
    },
    Deleted(String),
    Rejected(String),
    Matches(String),
}

fn parse(line: &str) -> Result<Expect, String> {
    if let Some(text) = line.strip_prefix("rejected ") {
        return Ok(Expect::Rejected(text.to_string()));
    }
    let (object, rest) = line
        .split_once(' ')
        .ok_or_else(|| format!("no object in {line:?}"))?;
    let object = object.to_string();
    match rest.trim() {
        "deleted" => return Ok(Expect::Deleted(object)),
        "matches" => return Ok(Expect::Matches(object)),
        _ => {}
    }
    // The JSONPath ends at the `}` before the operator (filters hold `==` inside it).
    let end = rest
        .find("} ")
        .ok_or_else(|| format!("no {{JSONPATH}} in {line:?}"))?;
    let path = rest[..=end].trim().to_string();
    let tail = &rest[end + 2..];
    if let Some(value) = tail.strip_prefix("!=") {
        let value = value.trim().to_string();
        return Ok(Expect::Differs {
            object,
            path,
            value,
        });
    }
    if let Some(value) = tail.strip_prefix('=') {
        let value = value.trim().to_string();
        return Ok(Expect::Equals {
            object,
            path,
            value,
        });
    }
    Err(format!("no `=` or `!=` in {line:?}"))
}

fn expectations(file: &Path) -> Vec<Expect> {
    let text = std::fs::read_to_string(file).expect("read example");
    text.lines()
        .filter_map(|line| line.strip_prefix("# expect:"))
        .map(|line| parse(line.trim()).unwrap_or_else(|e| panic!("{}: {e}", file.display())))
        .collect()
}

fn example_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join("examples"))
        .expect("examples/")
        .map(|entry| entry.expect("examples/ entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn get(ns: &str, object: &str, path: &str) -> Result<String, String> {
    let jsonpath = format!("jsonpath={path}");
    match run_kubectl(&["get", "-n", ns, object, "-o", &jsonpath], None) {
        (true, out, _) => Ok(out),
        (false, _, err) => Err(err),
    }
}

/// Polls until `check` says yes; the last thing seen when it never does.
fn eventually(mut check: impl FnMut() -> Result<(), String>) -> Result<(), String> {
    let start = Instant::now();
    loop {
        match check() {
            Ok(()) => return Ok(()),
            Err(seen) if start.elapsed() > DEADLINE => {
                return Err(format!("after {DEADLINE:?}: {seen}"));
            }
            Err(_) => std::thread::sleep(Duration::from_secs(2)),
        }
    }
}

/// Whether every field the file shows has that value in `live` (a field the live object leaves out
/// stands for an empty list or object).
fn shows_live(file: &serde_json::Value, live: &serde_json::Value, at: &str) -> Result<(), String> {
    match (file, live) {
        (serde_json::Value::Object(fields), serde_json::Value::Object(live_fields)) => {
            fields.iter().try_for_each(|(key, value)| {
                let at = format!("{at}.{key}");
                match live_fields.get(key) {
                    Some(live) => shows_live(value, live, &at),
                    None if is_empty(value) => Ok(()),
                    None => Err(format!(
                        "{at} is {value} in the file, missing in the cluster"
                    )),
                }
            })
        }
        (a, b) if a.as_f64().is_some() && a.as_f64() == b.as_f64() => Ok(()),
        (a, b) if a == b => Ok(()),
        (a, b) => Err(format!("{at} is {a} in the file, {b} in the cluster")),
    }
}

fn is_empty(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::Array(items) => items.is_empty(),
        serde_json::Value::Object(fields) => fields.is_empty(),
        _ => false,
    }
}

fn check(ns: &str, file: &Path, expect: &Expect) -> Result<(), String> {
    match expect {
        Expect::Equals {
            object,
            path,
            value,
        } => eventually(|| match get(ns, object, path)? {
            seen if seen == *value => Ok(()),
            seen => Err(format!("{object} {path} is {seen:?}, want {value:?}")),
        }),
        Expect::Differs {
            object,
            path,
            value,
        } => eventually(|| match get(ns, object, path)? {
            seen if seen != *value => Ok(()),
            seen => Err(format!("{object} {path} is still {seen:?}")),
        }),
        Expect::Deleted(object) => eventually(|| match get(ns, object, "{.metadata.name}") {
            Err(err) if err.contains("NotFound") => Ok(()),
            Err(err) => Err(err),
            Ok(_) => Err(format!("{object} still exists")),
        }),
        Expect::Matches(object) => {
            let text = std::fs::read_to_string(file).map_err(|e| e.to_string())?;
            let shown: serde_json::Value = ax::yaml::from_str(&text).map_err(|e| e.to_string())?;
            eventually(|| {
                let (ok, out, err) = run_kubectl(&["get", object, "-o", "json"], None);
                if !ok {
                    return Err(err);
                }
                let live: serde_json::Value =
                    serde_json::from_str(&out).map_err(|e| e.to_string())?;
                shows_live(&shown["spec"], &live["spec"], "spec")
            })
        }
        Expect::Rejected(_) => Ok(()),
    }
}

/// The attempts of the task an expectation is about, one line each, to say why a check failed
/// (an attempt lost to the infrastructure, say); empty for other objects.
fn attempts_of(ns: &str, expect: &Expect) -> String {
    let object = match expect {
        Expect::Equals { object, .. } | Expect::Differs { object, .. } => object,
        _ => return String::new(),
    };
    if !object.starts_with("axtask/") {
        return String::new();
    }
    let path = "{range .status.attempts[*]}\n  attempt {.attempt} on {.node}: {.outcome} \
                {.failureKind} {.reason} exit {.exitCode}{end}";
    get(ns, object, path)
        .map(|lines| format!("\n{object} attempts:{lines}"))
        .unwrap_or_default()
}

/// Applies one example in a namespace of its own and checks what it promises; deletes what it
/// created. Its failures, each naming the file.
fn run_example(file: &Path) -> Vec<String> {
    let name = file.file_stem().unwrap().to_string_lossy().to_string();
    let expects = expectations(file);
    let shown = file.display().to_string();
    if expects.iter().all(|e| matches!(e, Expect::Matches(_))) {
        return expects
            .iter()
            .filter_map(|e| check("default", file, e).err())
            .map(|e| format!("{shown}: {e}"))
            .collect();
    }
    let ns = format!("e2e-ex-{name}-{:04x}", rand::random::<u16>());
    let (ok, _, err) = run_kubectl(&["create", "namespace", &ns], None);
    if !ok {
        return vec![format!("{shown}: create namespace {ns}: {err}")];
    }
    let (applied, _, err) = run_kubectl(&["apply", "-n", &ns, "-f", &shown], None);
    let mut failures = Vec::new();
    for expect in &expects {
        let outcome = match (expect, applied) {
            (Expect::Rejected(text), false) if err.contains(text.as_str()) => Ok(()),
            (Expect::Rejected(text), false) => {
                Err(format!("refused, but not with {text:?}: {err}"))
            }
            (Expect::Rejected(_), true) => Err("accepted, but should be refused".to_string()),
            (_, false) => Err(format!("kubectl apply failed: {err}")),
            (expect, true) => check(&ns, file, expect),
        };
        if let Err(e) = outcome {
            let attempts = attempts_of(&ns, expect);
            failures.push(format!("{shown} (namespace {ns}): {e}{attempts}"));
        }
    }
    if applied {
        run_kubectl(
            &[
                "delete",
                "-n",
                &ns,
                "-f",
                &shown,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
    }
    failures
}

#[test]
fn every_example_reaches_the_outcome_its_header_promises() {
    let files = example_files();
    assert!(files.len() >= 30, "examples/ has {} files", files.len());
    let handles: Vec<_> = files
        .into_iter()
        .map(|file| std::thread::spawn(move || run_example(&file)))
        .collect();
    let failures: Vec<String> = handles
        .into_iter()
        .flat_map(|h| h.join().expect("example thread"))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_example_runs_on_any_cluster_promises_something_and_is_indexed() {
    let index = std::fs::read_to_string(repo_root().join("examples/README.md"))
        .expect("examples/README.md");
    for file in example_files() {
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            !text.contains("localhost/") && !text.contains("imagePullPolicy: Never"),
            "{name}: examples use public images (busybox:1.36, IfNotPresent) so they run on any cluster"
        );
        assert!(
            !expectations(&file).is_empty(),
            "{name}: no `# expect:` line says what it does"
        );
        assert!(
            index.contains(&format!("]({name})")),
            "examples/README.md does not link {name}"
        );
    }
    for linked in index.split("](").skip(1) {
        let target = linked.split(')').next().unwrap();
        if target.ends_with(".yaml") {
            assert!(
                repo_root().join("examples").join(target).exists(),
                "examples/README.md links {target}, which does not exist"
            );
        }
    }
}

#[test]
fn expectations_parse_with_filters_and_empty_values() {
    assert_eq!(
        parse(r#"axtask/a {.status.conditions[?(@.type=="Failed")].status} = True"#),
        Ok(Expect::Equals {
            object: "axtask/a".into(),
            path: r#"{.status.conditions[?(@.type=="Failed")].status}"#.into(),
            value: "True".into()
        })
    );
    assert_eq!(
        parse("axcron/c {.status.lastScheduleTime} != "),
        Ok(Expect::Differs {
            object: "axcron/c".into(),
            path: "{.status.lastScheduleTime}".into(),
            value: String::new()
        })
    );
    assert_eq!(
        parse("rejected Unsupported value"),
        Ok(Expect::Rejected("Unsupported value".into()))
    );
    assert!(parse("axtask/a {.status.phase} Dead").is_err());
}
