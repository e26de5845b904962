//! The lifecycle diagram, generated from the state machine's own edges
//! ([`consort_actors::lifecycle_edges`]): the main path as boxes in lifecycle order with what
//! moves the run along between them, what keeps a phase busy inside its box, and every other
//! edge (halts, retries, stops) in a table below. The feature's phase is marked.

use std::fmt::Write as _;

use consort_actors::{LifecycleEdge, Phase, lifecycle_edges};

use super::html::escape;

/// Phases off the main path: reached from many, drawn apart.
fn aside(p: Phase) -> bool {
    matches!(p, Phase::Halted | Phase::Stopped)
}

/// The labels of the edges from `from` to `to`, joined.
fn labels(edges: &[LifecycleEdge], from: Phase, to: Phase) -> Vec<&'static str> {
    edges
        .iter()
        .filter(|e| e.from == from && e.to == to)
        .map(|e| e.label)
        .collect()
}

fn phase_box(edges: &[LifecycleEdge], phase: Phase, current: Phase) -> String {
    let loops = labels(edges, phase, phase);
    let mark = if phase == current {
        " current\" aria-current=\"step"
    } else {
        ""
    };
    let mut out = format!(
        "<div class=\"phase{mark}\" data-phase=\"{}\">{}",
        phase.as_str(),
        phase.as_str()
    );
    if !loops.is_empty() {
        let _ = write!(
            out,
            "<span class=\"loops\">{}</span>",
            escape(&loops.join(" · "))
        );
    }
    out.push_str("</div>");
    out
}

/// The diagram, with `current` marked.
pub(super) fn diagram(current: Phase) -> String {
    let edges = lifecycle_edges();
    let main: Vec<Phase> = Phase::ALL.into_iter().filter(|p| !aside(*p)).collect();
    let mut out = String::from(
        "<section id=\"lifecycle\"><h2>Lifecycle</h2><p class=\"meta\">generated from the state machine's table; the feature's phase is marked</p><div class=\"lifecycle\">",
    );
    let mut drawn: Vec<(Phase, Phase)> = Vec::new();
    for (i, phase) in main.iter().enumerate() {
        if i > 0 {
            let from = main[i - 1];
            let between = labels(&edges, from, *phase);
            if !between.is_empty() {
                drawn.push((from, *phase));
            }
            let _ = write!(
                out,
                "<div class=\"edge\">{}</div>",
                escape(&between.join(" / "))
            );
        }
        out.push_str(&phase_box(&edges, *phase, current));
    }
    out.push_str("</div><div class=\"lifecycle\" style=\"margin-top:.6rem\">");
    for phase in Phase::ALL.into_iter().filter(|p| aside(*p)) {
        out.push_str(&phase_box(&edges, phase, current));
    }
    out.push_str("</div><table id=\"other-edges\"><tr><th>to</th><th>when</th><th>from</th></tr>");
    let mut grouped: Vec<(Phase, &'static str, Vec<&'static str>)> = Vec::new();
    for e in edges
        .iter()
        .filter(|e| e.from != e.to && !drawn.contains(&(e.from, e.to)))
    {
        match grouped
            .iter_mut()
            .find(|(to, label, _)| *to == e.to && *label == e.label)
        {
            Some((_, _, froms)) => froms.push(e.from.as_str()),
            None => grouped.push((e.to, e.label, vec![e.from.as_str()])),
        }
    }
    for (to, label, froms) in grouped {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            to.as_str(),
            escape(label),
            froms.join(", ")
        );
    }
    out.push_str("</table></section>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_diagram_has_every_phase_and_marks_the_current_one() {
        let html = diagram(Phase::Build);
        for phase in Phase::ALL {
            assert!(
                html.contains(&format!("data-phase=\"{}\"", phase.as_str())),
                "{phase} is missing"
            );
        }
        assert_eq!(html.matches("aria-current").count(), 1);
        assert!(
            html.contains("class=\"phase current\" aria-current=\"step\" data-phase=\"build\"")
        );
    }
}
