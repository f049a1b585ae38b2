//! The frame every console page shares (no client required, pure): head, navigation, notices,
//! the live region that Server-Sent Events replace, and small helpers (phase badges, times).
//! maud escapes every value put into the markup; nothing here writes unescaped user data.

use jiff::Timestamp;
use maud::{DOCTYPE, Markup, html};

use crate::client::format::{age, relative, time};

pub const CSS: &str = include_str!("assets/console.css");
pub const JS: &str = include_str!("assets/console.js");

/// A top-level section, for the navigation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    Tasks,
    Queues,
    Dags,
    Dashboard,
    Submit,
}

impl Section {
    const ALL: [Section; 5] = [
        Section::Tasks,
        Section::Queues,
        Section::Dags,
        Section::Dashboard,
        Section::Submit,
    ];

    fn path(self) -> &'static str {
        match self {
            Section::Tasks => "/tasks",
            Section::Queues => "/queues",
            Section::Dags => "/dags",
            Section::Dashboard => "/dashboard",
            Section::Submit => "/submit",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Section::Tasks => "Tasks",
            Section::Queues => "Queues",
            Section::Dags => "DAGs",
            Section::Dashboard => "Dashboard",
            Section::Submit => "Submit",
        }
    }
}

/// The outcome of an action, shown once at the top of the next page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub ok: bool,
    pub text: String,
}

/// What a page puts into the frame.
pub struct Page<'a> {
    pub title: String,
    pub section: Section,
    /// Where the console's own requests go; the token is in a hidden field of every form.
    pub token: &'a str,
    /// The scope line: which namespace the console watches, as whom.
    pub scope: &'a str,
    pub notices: Vec<Notice>,
    /// Above the live region (forms that must keep what the user typed).
    pub head: Markup,
    /// Replaced whenever the data changes (`None`: the page is not live).
    pub live: Option<Markup>,
    /// Below the live region.
    pub tail: Markup,
}

pub fn page(p: Page) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="ax-token" content=(p.token);
                title { (p.title) " · ax console" }
                link rel="stylesheet" href="/assets/console.css";
                script src="/assets/console.js" defer {}
            }
            body {
                header.top {
                    a.brand href="/tasks" { "ax" }
                    nav {
                        @for s in Section::ALL {
                            a href=(s.path()) class=(if s == p.section { "active" } else { "" }) { (s.label()) }
                        }
                    }
                    span.scope { (p.scope) }
                    span #live-status title="live updates" {}
                }
                main {
                    @for n in &p.notices {
                        div class=(if n.ok { "notice ok" } else { "notice error" }) role="status" { (n.text) }
                    }
                    (p.head)
                    @if let Some(live) = p.live {
                        div #live { (live) }
                    }
                    (p.tail)
                }
            }
        }
    }
}

/// The hidden token field of a form that changes something.
pub fn token_field(token: &str) -> Markup {
    html! { input type="hidden" name=(super::security::FORM_FIELD) value=(token); }
}

/// A phase as a coloured badge; `None`: not seen by the operator yet.
pub fn phase_badge(phase: Option<&str>) -> Markup {
    match phase {
        Some(p) => html! { span class=(format!("badge phase-{p}")) { (p) } },
        None => html! { span class="badge phase-none" { "new" } },
    }
}

/// A past time as its age, the exact time on hover.
pub fn ago(now: Timestamp, t: Option<Timestamp>) -> Markup {
    match t {
        Some(t) => html! { time datetime=(time(t)) title=(time(t)) { (age(now, t)) } },
        None => html! {},
    }
}

/// A time as `in 5s` / `5s ago`, the exact time on hover.
pub fn when(now: Timestamp, t: Timestamp) -> Markup {
    html! { time datetime=(time(t)) title=(time(t)) { (relative(now, t)) } }
}

/// A URL path segment, percent-encoded (names are DNS labels, but nothing is assumed).
pub fn seg(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

pub fn task_href(namespace: &str, name: &str) -> String {
    format!("/tasks/{}/{}", seg(namespace), seg(name))
}

pub fn dag_href(namespace: &str, name: &str) -> String {
    format!("/dags/{}/{}", seg(namespace), seg(name))
}

/// A page that could not be shown: what went wrong, in words.
pub fn problem(text: &str) -> Markup {
    html! { div.problem role="alert" { (text) } }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped() {
        let html = phase_badge(Some("<script>alert(1)</script>")).into_string();
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("&lt;script&gt;"));
        assert_eq!(seg("a/b c"), "a%2Fb+c");
    }

    #[test]
    fn the_frame_marks_the_section_and_shows_notices() {
        let notices = vec![Notice {
            ok: false,
            text: "not allowed <b>".into(),
        }];
        let html = page(Page {
            title: "Tasks".into(),
            section: Section::Queues,
            token: "t0k",
            scope: "namespace a",
            notices,
            head: html! {},
            live: Some(html! { p { "x" } }),
            tail: html! {},
        })
        .into_string();
        assert!(
            html.contains(r#"<a href="/queues" class="active">"#),
            "{html}"
        );
        assert!(html.contains("not allowed &lt;b&gt;"));
        assert!(html.contains(r#"<div id="live"><p>x</p></div>"#));
        assert!(html.contains(r#"content="t0k""#));
    }
}
