//! The AxTask state machine of DESIGN §3 as SVG, drawn on the server (no client required, pure).
//! The edges are `core::task::LEGAL`, the list the state machine itself checks its transitions
//! against, so the picture cannot drift from the code; only where each state sits is chosen here.
//! A task's path is its history: every edge it took is marked (`class="edge taken"`,
//! `data-count`), with the count written on edges taken more than once.

use std::collections::HashMap;

use maud::{Markup, html};

use crate::api::{HistoryEntry, TaskPhase};
use crate::core::task::LEGAL;

use TaskPhase::{Canceled, Dead, Failed, Pending, Running, Scheduled, Succeeded, TimedOut};

pub const WIDTH: f64 = 1000.0;
pub const HEIGHT: f64 = 540.0;
const BOX_W: f64 = 112.0;
const BOX_H: f64 = 38.0;
/// The start dot of a task the operator has not seen yet.
const START_R: f64 = 9.0;

/// A state of the diagram: `None` is "(new)".
pub type State = Option<TaskPhase>;

/// Where each state sits (its centre). Exhaustive: a new phase does not compile until placed.
pub fn position(state: State) -> (f64, f64) {
    match state {
        None => (40.0, 245.0),
        Some(Pending) => (170.0, 245.0),
        Some(Scheduled) => (370.0, 245.0),
        Some(Running) => (580.0, 130.0),
        Some(Succeeded) => (890.0, 130.0),
        Some(Failed) => (580.0, 350.0),
        Some(TimedOut) => (740.0, 245.0),
        Some(Dead) => (890.0, 350.0),
        Some(Canceled) => (370.0, 430.0),
    }
}

/// Edges routed around the outside of the picture (a cubic curve through these two control
/// points): re-runs back to Pending over the top or along the bottom, and a task Dead before it
/// was queued along the very bottom.
fn lane(from: State, to: TaskPhase) -> Option<((f64, f64), (f64, f64))> {
    let (fx, _) = position(from);
    let (tx, _) = position(Some(to));
    match (from, to) {
        (Some(Succeeded), Pending) => Some(((fx, 0.0), (tx, 0.0))),
        (Some(Dead), Pending) => Some(((fx + 40.0, 560.0), (tx, 560.0))),
        (None, Dead) => Some(((fx, 600.0), (tx + 60.0, 600.0))),
        _ => None,
    }
}

/// How far an edge bows from the straight line, in pixels (to the left of its direction). Pairs
/// legal both ways bow apart; a few long edges bow around the states in their way. Any pair not
/// listed is drawn too (straight, or bowed when its reverse exists).
fn bend(from: State, to: TaskPhase) -> f64 {
    match (from, to) {
        (Some(Running), Canceled) => 40.0,
        (Some(TimedOut), Canceled) => 60.0,
        (Some(Scheduled), TimedOut) => -25.0,
        (Some(TimedOut), Pending) => -55.0,
        (Some(Failed), Pending) => -40.0,
        (Some(Failed), Succeeded) => 70.0,
        (Some(TimedOut), Succeeded) => -25.0,
        (Some(TimedOut), Dead) => 10.0,
        _ if from.is_some_and(|f| LEGAL.contains(&(Some(to), f))) => 22.0,
        _ => 0.0,
    }
}

pub fn state_name(state: State) -> &'static str {
    state.map_or("new", TaskPhase::as_str)
}

/// How often the task took each transition, from its history.
pub fn path_counts(history: &[HistoryEntry]) -> HashMap<(State, TaskPhase), usize> {
    let mut counts = HashMap::new();
    for h in history {
        *counts.entry((h.from, h.to)).or_insert(0) += 1;
    }
    counts
}

/// The point where the ray from the centre of `state` towards `toward` leaves its shape.
fn boundary(state: State, toward: (f64, f64)) -> (f64, f64) {
    let (cx, cy) = position(state);
    let (dx, dy) = (toward.0 - cx, toward.1 - cy);
    let len = (dx * dx + dy * dy).sqrt().max(1e-9);
    if state.is_none() {
        return (cx + dx / len * START_R, cy + dy / len * START_R);
    }
    // Scale the direction until it meets the box's edge (a little outside, for the arrow).
    let sx = if dx.abs() > 1e-9 {
        (BOX_W / 2.0 + 3.0) / dx.abs()
    } else {
        f64::INFINITY
    };
    let sy = if dy.abs() > 1e-9 {
        (BOX_H / 2.0 + 3.0) / dy.abs()
    } else {
        f64::INFINITY
    };
    let s = sx.min(sy);
    (cx + dx * s, cy + dy * s)
}

/// One edge's geometry: the curve's path and the point for its label.
pub fn edge_geometry(from: State, to: TaskPhase) -> (String, (f64, f64)) {
    let a = position(from);
    let b = position(Some(to));
    if let Some((c1, c2)) = lane(from, to) {
        let start = boundary(from, c1);
        let end = boundary(Some(to), c2);
        let path = format!(
            "M{:.1},{:.1} C{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}",
            start.0, start.1, c1.0, c1.1, c2.0, c2.1, end.0, end.1
        );
        let label = (
            0.125 * start.0 + 0.375 * c1.0 + 0.375 * c2.0 + 0.125 * end.0,
            0.125 * start.1 + 0.375 * c1.1 + 0.375 * c2.1 + 0.125 * end.1,
        );
        return (path, label);
    }
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let len = (dx * dx + dy * dy).sqrt().max(1e-9);
    // Left of the direction of travel, in SVG's y-down coordinates.
    let (nx, ny) = (dy / len, -dx / len);
    let k = bend(from, to);
    let control = (
        (a.0 + b.0) / 2.0 + nx * k * 2.0,
        (a.1 + b.1) / 2.0 + ny * k * 2.0,
    );
    let start = boundary(from, control);
    let end = boundary(Some(to), control);
    let path = format!(
        "M{:.1},{:.1} Q{:.1},{:.1} {:.1},{:.1}",
        start.0, start.1, control.0, control.1, end.0, end.1
    );
    let label = (
        0.25 * start.0 + 0.5 * control.0 + 0.25 * end.0,
        0.25 * start.1 + 0.5 * control.1 + 0.25 * end.1,
    );
    (path, label)
}

fn all_states() -> Vec<State> {
    let mut states: Vec<State> = vec![None];
    for (from, to) in LEGAL {
        for s in [*from, Some(*to)] {
            if !states.contains(&s) {
                states.push(s);
            }
        }
    }
    states
}

/// The diagram, with the path of a task whose history is `history` and whose phase is `current`
/// (both empty/None: the plain machine).
pub fn render(history: &[HistoryEntry], current: State) -> Markup {
    let counts = path_counts(history);
    let visited: Vec<State> = history.iter().flat_map(|h| [h.from, Some(h.to)]).collect();
    html! {
        svg class="state-machine" xmlns="http://www.w3.org/2000/svg"
            viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img"
            aria-label="AxTask state machine with this task's path" {
            defs {
                marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7"
                    markerHeight="7" orient="auto-start-reverse" {
                    path d="M0,0 L10,5 L0,10 z" class="arrowhead" {}
                }
                marker id="arrow-taken" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6"
                    markerHeight="6" orient="auto-start-reverse" {
                    path d="M0,0 L10,5 L0,10 z" class="arrowhead taken" {}
                }
            }
            @for (from, to) in LEGAL {
                @let count = counts.get(&(*from, *to)).copied().unwrap_or(0);
                @let (d, (lx, ly)) = edge_geometry(*from, *to);
                @let id = format!("edge-{}-{}", state_name(*from), to.as_str());
                path id=(id) class=(if count > 0 { "edge taken" } else { "edge" })
                    data-from=(state_name(*from)) data-to=(to.as_str()) data-count=(count)
                    d=(d) marker-end=(if count > 0 { "url(#arrow-taken)" } else { "url(#arrow)" }) {
                    title { (state_name(*from)) " → " (to.as_str()) @if count > 0 { ": taken " (count) "×" } }
                }
                @if count > 1 {
                    g class="edge-count" data-edge=(format!("{}-{}", state_name(*from), to.as_str())) {
                        circle cx=(format!("{lx:.1}")) cy=(format!("{ly:.1}")) r="10" {}
                        text x=(format!("{lx:.1}")) y=(format!("{:.1}", ly + 4.0)) { (count) }
                    }
                }
            }
            @for state in all_states() {
                @let (x, y) = position(state);
                @let class = state_class(state, visited.contains(&state), state == current && !history.is_empty());
                g class=(class) data-state=(state_name(state)) {
                    @if state.is_none() {
                        circle cx=(x) cy=(y) r=(START_R) {}
                        text class="start-label" x=(x) y=(y + 26.0) { "new" }
                    } @else {
                        rect x=(x - BOX_W / 2.0) y=(y - BOX_H / 2.0) width=(BOX_W) height=(BOX_H) rx="8" {}
                        @if state.is_some_and(TaskPhase::is_terminal) {
                            rect class="inner" x=(x - BOX_W / 2.0 + 3.0) y=(y - BOX_H / 2.0 + 3.0)
                                width=(BOX_W - 6.0) height=(BOX_H - 6.0) rx="6" {}
                        }
                        text x=(x) y=(y + 5.0) { (state_name(state)) }
                    }
                }
            }
        }
    }
}

fn state_class(state: State, visited: bool, current: bool) -> String {
    let mut class = String::from("state");
    if visited {
        class.push_str(" visited");
    }
    if current {
        class.push_str(" current");
    }
    if let Some(p) = state {
        class.push_str(&format!(" phase-{p}"));
        if p.is_terminal() {
            class.push_str(" terminal");
        }
    }
    class
}

/// Transitions in the history that the table does not have (none, unless the history was
/// edited by hand): listed under the diagram rather than silently left out.
pub fn unexpected(history: &[HistoryEntry]) -> Vec<(State, TaskPhase)> {
    let mut out = Vec::new();
    for h in history {
        if !LEGAL.contains(&(h.from, h.to)) && !out.contains(&(h.from, h.to)) {
            out.push((h.from, h.to));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(from: State, to: TaskPhase) -> HistoryEntry {
        HistoryEntry {
            time: jiff::Timestamp::UNIX_EPOCH,
            from,
            to,
            attempt: 1,
            reason: "R".into(),
            message: String::new(),
            actor: "test".into(),
        }
    }

    /// `(id, class, data-count)` of every edge in the SVG.
    fn edges(svg: &str) -> Vec<(String, String, usize)> {
        svg.split("<path id=\"edge-")
            .skip(1)
            .map(|rest| {
                let id = rest[..rest.find('"').unwrap()].to_string();
                let attr = |name: &str| {
                    let start = rest.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
                    rest[start..start + rest[start..].find('"').unwrap()].to_string()
                };
                (id, attr("class"), attr("data-count").parse().unwrap())
            })
            .collect()
    }

    #[test]
    fn every_legal_transition_is_one_edge_and_nothing_else_is() {
        let svg = render(&[], None).into_string();
        let drawn: Vec<String> = edges(&svg).into_iter().map(|e| e.0).collect();
        let legal: Vec<String> = LEGAL
            .iter()
            .map(|(f, t)| format!("{}-{}", state_name(*f), t.as_str()))
            .collect();
        assert_eq!(drawn, legal);
        for phase in crate::client::task::ALL_PHASES {
            assert!(
                svg.contains(&format!("data-state=\"{phase}\"")),
                "{phase} drawn"
            );
        }
    }

    #[test]
    fn the_path_marks_taken_edges_with_their_counts() {
        // Two failed attempts, then Dead.
        let history = vec![
            entry(None, Pending),
            entry(Some(Pending), Scheduled),
            entry(Some(Scheduled), Running),
            entry(Some(Running), Failed),
            entry(Some(Failed), Pending),
            entry(Some(Pending), Scheduled),
            entry(Some(Scheduled), Running),
            entry(Some(Running), Failed),
            entry(Some(Failed), Dead),
        ];
        let svg = render(&history, Some(Dead)).into_string();
        let taken: Vec<(String, usize)> = edges(&svg)
            .into_iter()
            .filter(|e| e.1 == "edge taken")
            .map(|e| (e.0, e.2))
            .collect();
        assert_eq!(
            taken,
            [
                ("new-Pending", 1),
                ("Pending-Scheduled", 2),
                ("Scheduled-Running", 2),
                ("Running-Failed", 2),
                ("Failed-Pending", 1),
                ("Failed-Dead", 1),
            ]
            .map(|(id, n)| (id.to_string(), n))
        );
        // Counts are written on the edges taken more than once only.
        assert_eq!(svg.matches("class=\"edge-count\"").count(), 3);
        assert!(svg.contains("data-edge=\"Pending-Scheduled\""));
        assert!(svg.contains("class=\"state visited current phase-Dead terminal\""));
        assert!(!svg.contains("phase-Succeeded terminal visited"));
        assert!(unexpected(&history).is_empty());
    }

    #[test]
    fn edges_stay_inside_the_picture() {
        for (from, to) in LEGAL {
            let (d, (lx, ly)) = edge_geometry(*from, *to);
            let numbers: Vec<f64> = d
                .split(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().unwrap())
                .collect();
            // A curve stays within the hull of its points; control points may lie outside the
            // picture, the curve itself does not reach them.
            for pair in numbers.chunks(2) {
                let (x, y) = (pair[0], pair[1]);
                assert!(
                    (-HEIGHT..2.0 * WIDTH).contains(&x) && (-HEIGHT..1.5 * HEIGHT).contains(&y),
                    "{from:?}->{to:?}: {d}"
                );
            }
            assert!(
                (0.0..WIDTH).contains(&lx) && (0.0..HEIGHT).contains(&ly),
                "label of {from:?}->{to:?} at {lx},{ly}"
            );
        }
    }

    #[test]
    fn hand_made_transitions_are_reported_not_dropped() {
        let history = vec![entry(Some(Succeeded), Running)];
        assert_eq!(unexpected(&history), vec![(Some(Succeeded), Running)]);
    }
}
