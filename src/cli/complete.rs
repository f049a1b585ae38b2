//! Completion for `kubectl ax <TAB>`: kubectl (1.26 and later) runs `kubectl_complete-ax` with
//! the words after `ax`, the last one the word being completed, and reads one candidate per line
//! and then cobra's directive line. `complete` decides the candidates from the words and the
//! names it is given (pure); `run` reads those names from the cluster when it can, and offers
//! none when it cannot (client required).

use std::time::Duration;

use clap::CommandFactory;
use kube::ResourceExt;
use kube::api::ListParams;

use crate::client::ctx::{Ctx, GlobalArgs};

use super::args::Cli;

/// cobra's `ShellCompDirectiveNoFileComp`: the shell offers no file names instead.
pub const NO_FILE_COMPLETION: &str = ":4";

/// How long a completion may wait for the API server: a slow TAB is worse than none.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// Names that completion may need, read only when asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Names {
    Tasks,
    Dags,
    Queues,
    Crons,
}

/// Flags that take the next word as their value (so it is not a name to complete).
const VALUE_FLAGS: &[&str] = &[
    "-n",
    "--namespace",
    "--context",
    "--kubeconfig",
    "--operator-namespace",
    "--operator-lease",
    "-l",
    "--selector",
    "-o",
    "--output",
    "--phase",
    "--type",
    "--queue",
    "--timeout",
    "--for",
    "--name",
    "--older-than",
    "-c",
    "--container",
    "--attempt",
    "--tail",
    "--image",
    "--image-pull-policy",
    "--command",
    "-e",
    "--env",
    "--priority",
    "--payload",
    "--max-retries",
    "--hard-timeout",
    "--soft-timeout",
    "--budget",
    "--start-after",
    "--ttl",
    "--label",
    "--traceparent",
    "--file",
];

/// The verbs of `kubectl ax`, with their visible aliases.
pub fn verbs() -> Vec<String> {
    let command = Cli::command();
    let mut verbs: Vec<String> = command
        .get_subcommands()
        .flat_map(|c| {
            std::iter::once(c.get_name().to_owned())
                .chain(c.get_visible_aliases().map(str::to_owned))
        })
        .collect();
    verbs.push("help".into());
    verbs
}

/// What a verb's arguments name: kinds by `KIND/` prefix, and what a bare name is.
fn kinds_of(verb: &str) -> (&'static [(&'static str, Names)], Option<Names>) {
    match verb {
        "describe" => (
            &[
                ("dag/", Names::Dags),
                ("queue/", Names::Queues),
                ("cron/", Names::Crons),
            ],
            Some(Names::Tasks),
        ),
        "retry" | "cancel" | "wait" | "delete" => (&[("dag/", Names::Dags)], Some(Names::Tasks)),
        "suspend" | "resume" => (&[("queue/", Names::Queues)], Some(Names::Tasks)),
        "logs" | "resubmit" => (&[], Some(Names::Tasks)),
        "dag" => (&[], Some(Names::Dags)),
        "top" => (&[], Some(Names::Queues)),
        _ => (&[], None),
    }
}

/// cobra's `ShellCompDirectiveDefault`: the shell may offer file names (for `submit -f`).
pub const FILE_COMPLETION: &str = ":0";

/// Whether the word being completed is a file name: the value of `submit -f`/`--file` or of
/// `--kubeconfig` (`-f` is `--follow` of `logs`, so it counts for `submit` only).
pub fn wants_files(words: &[String]) -> bool {
    let Some((_, before)) = words.split_last() else {
        return false;
    };
    match before.last().map(String::as_str) {
        Some("--file" | "--kubeconfig") => true,
        Some("-f") => before.iter().any(|w| w == "submit"),
        _ => false,
    }
}

/// The words after `ax` split into positional words and the word being completed; None when
/// that word is a flag or a flag's value (nothing to offer).
fn positionals(words: &[String]) -> Option<(Vec<&str>, &str)> {
    let (current, before) = match words.split_last() {
        Some((last, rest)) => (last.as_str(), rest),
        None => ("", &[][..]),
    };
    if current.starts_with('-') {
        return None;
    }
    let mut positional = Vec::new();
    let mut takes_value = false;
    for word in before {
        if takes_value {
            takes_value = false;
        } else if word == "--" {
            // Everything after is the worker's command (`submit ... -- CMD`).
            return None;
        } else if word.starts_with('-') {
            let submit_file = word == "-f" && positional.first() == Some(&"submit");
            takes_value =
                !word.contains('=') && (submit_file || VALUE_FLAGS.contains(&word.as_str()));
        } else {
            positional.push(word.as_str());
        }
    }
    (!takes_value).then_some((positional, current))
}

/// The candidates for the last word of `words`, given a reader of names (called at most once,
/// and only when names are wanted).
pub fn complete(words: &[String], names: impl FnOnce(Names) -> Vec<String>) -> Vec<String> {
    let Some((positional, current)) = positionals(words) else {
        return Vec::new();
    };
    let starting = |candidates: Vec<String>| -> Vec<String> {
        candidates
            .into_iter()
            .filter(|c| c.starts_with(current))
            .collect()
    };
    let Some(verb) = positional.first() else {
        return starting(verbs());
    };
    if *verb == "cron" {
        return match positional.get(1) {
            None => starting(
                ["list", "ls", "trigger", "suspend", "resume"]
                    .map(String::from)
                    .to_vec(),
            ),
            Some(&("trigger" | "suspend" | "resume")) if positional.len() == 2 => {
                starting(names(Names::Crons))
            }
            Some(_) => Vec::new(),
        };
    }
    if *verb == "completion" {
        return if positional.len() == 1 {
            starting(["bash", "zsh", "fish"].map(String::from).to_vec())
        } else {
            Vec::new()
        };
    }
    let (prefixed, bare) = kinds_of(verb);
    if let Some((prefix, kind)) = prefixed.iter().find(|(p, _)| current.starts_with(p)) {
        return starting(
            names(*kind)
                .into_iter()
                .map(|n| format!("{prefix}{n}"))
                .collect(),
        );
    }
    match bare {
        Some(kind) => starting(names(kind)),
        None => Vec::new(),
    }
}

/// The connection flags among the words: completion looks where the command would.
pub fn global_args(words: &[String]) -> GlobalArgs {
    let mut global = GlobalArgs::default();
    let mut words = words.iter();
    while let Some(word) = words.next() {
        let (flag, inline) = match word.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_owned())),
            _ => (word.as_str(), None),
        };
        let slot = match flag {
            "-n" | "--namespace" => &mut global.namespace,
            "--context" => &mut global.context,
            "--kubeconfig" => {
                let value = inline.or_else(|| words.next().cloned());
                global.kubeconfig = value.map(Into::into);
                continue;
            }
            "-A" | "--all-namespaces" => {
                global.all_namespaces = true;
                continue;
            }
            _ => continue,
        };
        *slot = inline.or_else(|| words.next().cloned());
    }
    global
}

async fn read_names(ctx: &Ctx, kind: Names) -> Vec<String> {
    let params = ListParams::default();
    let namespace = ctx.list_namespace();
    let names: Result<Vec<String>, kube::Error> = match kind {
        Names::Tasks => ctx
            .tasks(namespace)
            .list_metadata(&params)
            .await
            .map(|l| l.items.iter().map(|o| o.name_any()).collect()),
        Names::Dags => ctx
            .dags(namespace)
            .list_metadata(&params)
            .await
            .map(|l| l.items.iter().map(|o| o.name_any()).collect()),
        Names::Queues => ctx
            .queues()
            .list_metadata(&params)
            .await
            .map(|l| l.items.iter().map(|o| o.name_any()).collect()),
        Names::Crons => {
            let api: kube::Api<crate::api::AxCron> = match namespace {
                Some(ns) => kube::Api::namespaced(ctx.client.clone(), ns),
                None => kube::Api::all(ctx.client.clone()),
            };
            api.list_metadata(&params)
                .await
                .map(|l| l.items.iter().map(|o| o.name_any()).collect())
        }
    };
    let mut names = names.unwrap_or_default();
    names.sort();
    names.dedup();
    names
}

/// The whole answer for kubectl: candidates, one a line, then the directive line. Names come
/// from the cluster when it answers within `LOOKUP_TIMEOUT`; otherwise there are none.
pub async fn run(words: &[String]) -> String {
    let wanted = {
        let mut wanted = None;
        complete(words, |kind| {
            wanted = Some(kind);
            Vec::new()
        });
        wanted
    };
    let fetched = match wanted {
        None => Vec::new(),
        Some(kind) => {
            let lookup = async {
                match Ctx::connect(&global_args(words)).await {
                    Ok(ctx) => read_names(&ctx, kind).await,
                    Err(_) => Vec::new(),
                }
            };
            tokio::time::timeout(LOOKUP_TIMEOUT, lookup)
                .await
                .unwrap_or_default()
        }
    };
    let mut out = String::new();
    for candidate in complete(words, |_| fetched) {
        out.push_str(&candidate);
        out.push('\n');
    }
    out.push_str(if wants_files(words) {
        FILE_COMPLETION
    } else {
        NO_FILE_COMPLETION
    });
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        // A trailing blank means a new, empty word is being completed.
        let mut w: Vec<String> = line.split_whitespace().map(String::from).collect();
        if line.is_empty() || line.ends_with(' ') {
            w.push(String::new());
        }
        w
    }

    fn names(kind: Names) -> Vec<String> {
        match kind {
            Names::Tasks => vec!["nightly".into(), "nightly-2".into(), "report".into()],
            Names::Dags => vec!["diamond".into()],
            Names::Queues => vec!["batch".into()],
            Names::Crons => vec!["hourly".into()],
        }
    }

    fn candidates(line: &str) -> Vec<String> {
        complete(&words(line), names)
    }

    #[test]
    fn the_first_word_is_a_verb() {
        let all = candidates("");
        for verb in [
            "list", "ls", "describe", "delete", "resubmit", "cron", "wait",
        ] {
            assert!(all.contains(&verb.to_string()), "{verb} in {all:?}");
        }
        assert_eq!(candidates("res"), ["resume", "resubmit"]);
        assert_eq!(candidates("-n x de"), ["describe", "delete"]);
    }

    #[test]
    fn verbs_taking_tasks_offer_task_names_and_kind_prefixes_their_kind() {
        assert_eq!(candidates("describe night"), ["nightly", "nightly-2"]);
        assert_eq!(
            candidates("retry nightly "),
            ["nightly", "nightly-2", "report"]
        );
        assert_eq!(candidates("describe queue/"), ["queue/batch"]);
        assert_eq!(candidates("delete dag/d"), ["dag/diamond"]);
        assert_eq!(candidates("suspend queue/b"), ["queue/batch"]);
        assert_eq!(candidates("dag "), ["diamond"]);
        assert_eq!(candidates("top "), ["batch"]);
        assert_eq!(
            candidates("cron "),
            ["list", "ls", "trigger", "suspend", "resume"]
        );
        assert_eq!(candidates("cron trigger "), ["hourly"]);
        assert_eq!(candidates("completion z"), ["zsh"]);
    }

    #[test]
    fn flags_and_their_values_get_nothing() {
        assert!(candidates("describe -").is_empty());
        assert!(candidates("list -l ").is_empty());
        assert!(candidates("describe -n ").is_empty());
        assert!(candidates("submit --type x -- ").is_empty());
        assert!(candidates("list ").is_empty(), "list takes no names");
        // A flag's value is not the verb: the verb is still completed after it.
        assert_eq!(candidates("-n team-a describe r"), ["report"]);
        assert_eq!(candidates("describe --namespace=x r"), ["report"]);
    }

    #[test]
    fn file_values_let_the_shell_offer_files_and_logs_follow_is_no_value() {
        assert!(wants_files(&words("submit -f ")));
        assert!(wants_files(&words("list --kubeconfig ")));
        assert!(!wants_files(&words("logs -f ")));
        assert!(!wants_files(&words("describe ")));
        assert_eq!(candidates("logs -f n"), ["nightly", "nightly-2"]);
        assert!(candidates("submit -f ").is_empty());
    }

    #[test]
    fn names_are_read_only_when_wanted() {
        let mut asked = Vec::new();
        complete(&words("li"), |k| {
            asked.push(k);
            vec![]
        });
        assert!(asked.is_empty());
        complete(&words("logs "), |k| {
            asked.push(k);
            vec![]
        });
        assert_eq!(asked, [Names::Tasks]);
    }

    #[test]
    fn the_connection_flags_are_taken_from_the_words() {
        let g = global_args(&words("describe -n team-a --context=kind x"));
        assert_eq!(g.namespace.as_deref(), Some("team-a"));
        assert_eq!(g.context.as_deref(), Some("kind"));
        let g = global_args(&words("--namespace=b -A --kubeconfig /k list"));
        assert_eq!(g.namespace.as_deref(), Some("b"));
        assert!(g.all_namespaces);
        assert_eq!(g.kubeconfig, Some("/k".into()));
    }
}
