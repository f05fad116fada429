//! Eager handling ([`RunMachine::handle_eager`]): the same events and actions as
//! [`RunMachine::handle_into`], cut after each launch.

use serde_json::json;

use super::tests::{call, machine};
use super::*;

/// The inputs of a one-step fan-out: the root, `n` calls reading what it writes, the stream's
/// end, then the root's outcome.
fn fan_out(n: usize) -> Vec<RunInput> {
    let mut inputs = vec![RunInput::Start];
    let mut calls = vec![json!({"_tool": "act", "_outputPath": "†state.root"})];
    calls.extend((0..n).map(|i| json!({"_tool": "act", "i": i, "in": "†state.root"})));
    for c in calls {
        inputs.push(RunInput::Call {
            frame: None,
            call: call(c).into(),
            parsed: Default::default(),
        });
    }
    inputs.push(RunInput::StreamClosed {
        frame: None,
        error: None,
        finish_reason: None,
    });
    inputs.push(RunInput::Outcome {
        call: CallId(1),
        outcome: scheduler::Outcome::ok(json!(7)),
    });
    inputs
}

/// The actions as text, to compare (actions are not `PartialEq`).
fn shown<'a>(actions: impl IntoIterator<Item = &'a Action>) -> Vec<String> {
    actions.into_iter().map(|a| format!("{a:?}")).collect()
}

fn launches(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| matches!(a, Action::Launch { .. }))
        .count()
}

#[test]
fn eager_handling_gives_the_same_actions_cut_after_each_launch() {
    let mut whole = machine(json!({}), Policy::auto());
    let mut eager = machine(json!({}), Policy::auto());
    let (mut all, mut parts) = (Vec::new(), Vec::new());
    for input in fan_out(5) {
        whole.handle_into(input.clone(), 10, &mut all);
        let mut part = Vec::new();
        let mut more = eager.handle_eager(input, 10, &mut part);
        parts.push(std::mem::take(&mut part));
        while more {
            more = eager.resume_into(&mut part);
            parts.push(std::mem::take(&mut part));
        }
        assert!(!eager.has_more());
    }
    assert_eq!(shown(parts.iter().flatten()), shown(&all));
    // The root's outcome launched the five readers one part at a time, each part ending with
    // its launch.
    let last = &parts[parts.len() - 5..];
    assert!(
        last.iter()
            .all(|p| launches(p) == 1 && matches!(p.last(), Some(Action::Launch { .. }))),
        "{last:?}"
    );
    assert_eq!(launches(&parts[parts.len() - 6]), 0, "the root's own input");
}

#[test]
fn an_input_given_before_an_eager_stop_is_finished_waits_for_it() {
    let mut whole = machine(json!({}), Policy::auto());
    let mut eager = machine(json!({}), Policy::auto());
    let (mut all, mut out) = (Vec::new(), Vec::new());
    let mut stopped = false;
    for input in fan_out(3) {
        whole.handle_into(input.clone(), 10, &mut all);
        // Never resumed by hand: the next input finishes the one before first.
        stopped |= eager.handle_eager(input, 10, &mut out);
    }
    assert!(stopped, "the root's outcome stopped after its first launch");
    // The cancel below comes, later, while the root's outcome is unfinished: what is left of
    // that outcome is still handled at its own time.
    assert!(eager.has_more());
    let cancel = RunInput::Cancel {
        reason: "stop".into(),
        by: None,
    };
    whole.handle_into(cancel.clone(), 11, &mut all);
    eager.handle_into(cancel, 11, &mut out);
    assert_eq!(shown(&all), shown(&out));
    assert_eq!(launches(&out), 4);
}
