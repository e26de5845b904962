//! The terminal's gate prompt, and the one spinner it must never be drawn over.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Mutex;

use chrono::Utc;
use consort_actors::{
    Approver, BoxFuture, DesignBundle, GateApproval, GateDecision, GateKind, GateRequest,
};
use indicatif::ProgressBar;

/// The spinner on standard error while a run prints progress (one per process: there is one
/// terminal). A prompt hides it for as long as it waits for an answer.
static SPINNER: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Makes `bar` the spinner prompts hide (`None`: there is none any more).
pub(crate) fn set_spinner(bar: Option<ProgressBar>) {
    let mut slot = SPINNER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    *slot = bar;
}

/// Runs `f` with the spinner (if any) hidden and not ticking, so that nothing draws over
/// what `f` writes or over the answer typed after it.
pub fn without_spinner<T>(f: impl FnOnce() -> T) -> T {
    let bar = SPINNER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    match bar {
        Some(bar) => bar.suspend(f),
        None => f(),
    }
}

/// Asks at the terminal for each gate, showing the summary and the hash, and offering the
/// frozen design at the design gate.
#[derive(Debug, Clone)]
pub struct TerminalApprover {
    /// Who is approving (recorded in the ledger).
    pub name: String,
    /// Where the run writes its frozen design (`Project::design_path`).
    pub design_file: PathBuf,
}

impl Approver for TerminalApprover {
    fn decide<'a>(&'a self, request: &'a GateRequest) -> BoxFuture<'a, Option<GateApproval>> {
        let request = request.clone();
        let me = self.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                without_spinner(|| {
                    let stdin = std::io::stdin();
                    let mut input = stdin.lock();
                    me.ask(&request, &mut input, &mut std::io::stderr())
                })
            })
            .await
            .ok()
            .flatten()
        })
    }
}

impl TerminalApprover {
    /// Shows the gate on `out` and reads the answer from `input` until it is yes or no (`None`
    /// when the input ends: no decision, the gate stays closed).
    pub fn ask(
        &self,
        request: &GateRequest,
        input: &mut impl BufRead,
        out: &mut impl Write,
    ) -> Option<GateApproval> {
        let design = request.gate == GateKind::Design;
        let _ = writeln!(
            out,
            "\n── {} gate ──\n{}\nhash: {}",
            request.gate, request.summary, request.hash
        );
        if design {
            let _ = writeln!(
                out,
                "the design is frozen in {}",
                self.design_file.display()
            );
        }
        let yes = loop {
            let offer = if design { ", [s]how the design" } else { "" };
            let _ = write!(out, "Approve as {}? [y]es, [n]o{offer}: ", self.name);
            let _ = out.flush();
            let mut line = String::new();
            match input.read_line(&mut line) {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
            match line.trim() {
                "y" | "Y" | "yes" => break true,
                "n" | "N" | "no" | "" => break false,
                "s" | "S" | "show" if design => {
                    let _ = writeln!(out, "{}", self.design_shown());
                }
                other => {
                    let _ = writeln!(out, "{other} is not an answer here");
                }
            }
        };
        Some(GateApproval {
            gate: request.gate,
            hash: request.hash,
            approver: self.name.clone(),
            at: Utc::now(),
            decision: if yes {
                GateDecision::Approve
            } else {
                GateDecision::Reject {
                    reason: "declined at the terminal".into(),
                }
            },
            note: String::new(),
        })
    }

    /// The frozen design as text, or why it cannot be shown.
    fn design_shown(&self) -> String {
        let path = self.design_file.display();
        let text = match std::fs::read_to_string(&self.design_file) {
            Ok(text) => text,
            Err(e) => return format!("cannot read {path}: {e}"),
        };
        match serde_json::from_str::<DesignBundle>(&text) {
            Ok(bundle) => crate::design_text::design_text(&bundle),
            Err(e) => format!("{path} is not a design bundle: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use consort_actors::ContentHash;

    fn request(gate: GateKind) -> GateRequest {
        GateRequest {
            gate,
            hash: ContentHash::of_bytes(b"design"),
            summary: "3 stories, 10 tests".into(),
        }
    }

    fn approver() -> TerminalApprover {
        TerminalApprover {
            name: "ada".into(),
            design_file: PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/design_bundle.json"
            )),
        }
    }

    fn asked(gate: GateKind, typed: &str) -> (Option<GateApproval>, String) {
        let mut out = Vec::new();
        let got = approver().ask(&request(gate), &mut typed.as_bytes(), &mut out);
        (got, String::from_utf8_lossy(&out).into_owned())
    }

    #[test]
    fn the_design_gate_offers_the_design_and_says_where_it_is() {
        let (got, said) = asked(GateKind::Design, "s\ny\n");
        let Some(approval) = got else {
            panic!("no decision: {said}")
        };
        assert_eq!(approval.decision, GateDecision::Approve);
        assert_eq!(approval.hash, ContentHash::of_bytes(b"design"));
        assert!(said.contains("frozen in"), "{said}");
        assert!(said.contains("design_bundle.json"), "{said}");
        assert!(said.contains("[s]how the design"), "{said}");
        assert!(said.contains("Tests, in build order"), "{said}");
    }

    #[test]
    fn other_gates_do_not_offer_it_and_anything_but_yes_declines() {
        let (got, said) = asked(GateKind::Deploy, "s\nn\n");
        assert!(!said.contains("[s]how"), "{said}");
        assert!(said.contains("s is not an answer here"), "{said}");
        assert!(matches!(
            got.map(|a| a.decision),
            Some(GateDecision::Reject { .. })
        ));
    }

    #[test]
    fn an_input_that_ends_decides_nothing() {
        let (got, _) = asked(GateKind::Design, "s\n");
        assert!(got.is_none());
    }
}
