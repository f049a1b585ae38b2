//! What the console's buttons do (client required), through the same code as `kubectl ax retry`
//! and `kubectl ax cancel`: a re-run request preconditioned on the resourceVersion read, and
//! `spec.cancel: true`, each made with the user's credentials, so the API server's RBAC decides.
//! Every target gets one notice saying what happened to it, in words.

use kube::Api;

use crate::api::AxTask;
use crate::client::ctx::Ctx;
use crate::client::error::{ClientError, Op, Resource, from_kube};
use crate::client::operator;
use crate::client::rerun::{
    CancelDecision, RetryDecision, cancel_decision_task, cancel_task, patch_params, rerun,
    retry_decision_task,
};

use super::html::Notice;

/// Which button.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Cancel,
    Retry,
}

/// `ns/name` → (ns, name); anything else is not a target.
pub fn parse_target(text: &str) -> Option<(String, String)> {
    let (ns, name) = text.split_once('/')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains('/'))
        .then(|| (ns.to_owned(), name.to_owned()))
}

/// An error as the person who clicked should read it.
pub fn error_notice(label: &str, e: &ClientError) -> Notice {
    let text = match e {
        ClientError::Forbidden { .. } => format!("{label}: not allowed — {e}"),
        _ => format!("{label}: {e}"),
    };
    Notice { ok: false, text }
}

fn needs_write(action: Action, task: &AxTask) -> bool {
    match action {
        Action::Cancel => matches!(cancel_decision_task(task), CancelDecision::Cancel { .. }),
        Action::Retry => matches!(retry_decision_task(task), RetryDecision::Rerun { .. }),
    }
}

/// Does `action` on every target; one notice each.
pub async fn run(ctx: &Ctx, action: Action, targets: &[String]) -> Vec<Notice> {
    let mut notices = Vec::new();
    if targets.is_empty() {
        notices.push(Notice {
            ok: false,
            text: "Nothing selected.".into(),
        });
        return notices;
    }
    let mut tasks = Vec::new();
    for t in targets {
        let Some((ns, name)) = parse_target(t) else {
            notices.push(Notice {
                ok: false,
                text: format!("{t:?} is not namespace/name"),
            });
            continue;
        };
        let label = format!("axtask/{name} in {ns}");
        let op = Op::new("get", Resource::Task)
            .namespace(Some(&ns))
            .name(&name);
        match Api::<AxTask>::namespaced(ctx.client.clone(), &ns)
            .get(&name)
            .await
        {
            Ok(task) => tasks.push((label, task)),
            Err(e) => notices.push(error_notice(&label, &from_kube(&op, e))),
        }
    }
    if tasks.iter().any(|(_, t)| needs_write(action, t))
        && let Err(e) = operator::check(ctx).await
    {
        notices.push(Notice {
            ok: false,
            text: format!("Nothing was changed: {e}"),
        });
        return notices;
    }
    for (label, task) in tasks {
        notices.push(match action {
            Action::Cancel => match cancel_task(ctx, &task, &patch_params(false)).await {
                Ok(CancelDecision::Cancel { phase }) => Notice {
                    ok: true,
                    text: format!("{label}: cancel requested (was {phase})"),
                },
                Ok(CancelDecision::AlreadyRequested) => Notice {
                    ok: true,
                    text: format!("{label}: cancel already requested"),
                },
                Ok(CancelDecision::AlreadyFinished { phase }) => Notice {
                    ok: false,
                    text: format!("{label}: already {phase}, nothing to cancel"),
                },
                Err(e) => error_notice(&label, &e),
            },
            Action::Retry => {
                match rerun(ctx, Resource::Task, task, retry_decision_task, false).await {
                    Ok((RetryDecision::Rerun { phase, .. }, next)) => Notice {
                        ok: true,
                        text: format!("{label}: re-run requested (spec.rerun {next}; was {phase})"),
                    },
                    Ok((RetryDecision::AlreadyRequested { rerun }, _)) => Notice {
                        ok: true,
                        text: format!(
                            "{label}: a re-run is already requested (spec.rerun {rerun}, not started yet)"
                        ),
                    },
                    Ok((RetryDecision::NotFinished { phase }, _)) => Notice {
                        ok: false,
                        text: format!(
                            "{label}: not finished ({phase}); only finished tasks can be re-run"
                        ),
                    },
                    Ok((RetryDecision::NothingFailed, _)) => Notice {
                        ok: false,
                        text: format!("{label}: nothing to re-run"),
                    },
                    Err(e) => error_notice(&label, &e),
                }
            }
        });
    }
    notices
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_namespace_slash_name() {
        assert_eq!(parse_target("a/b"), Some(("a".into(), "b".into())));
        for bad in ["b", "/b", "a/", "a/b/c"] {
            assert_eq!(parse_target(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_denial_says_not_allowed_and_who() {
        let e = ClientError::Forbidden {
            op: Op::new("patch", Resource::Task).namespace(Some("n")),
            user: Some("viewer".into()),
        };
        let n = error_notice("axtask/x in n", &e);
        assert!(!n.ok);
        assert!(
            n.text.starts_with("axtask/x in n: not allowed — no permission to patch axtasks.ax.dev in namespace \"n\" as \"viewer\""),
            "{}",
            n.text
        );
    }
}
