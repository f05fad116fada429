//! The machine's timers (spec/timers.md): set and cleared where the machine decides, read off it
//! by a driver (no action announces one), fired only while set, and logged with their place
//! among the actions for a driver replaying a history recorded when actions announced them.

use std::time::Duration;

use serde_json::json;

use super::tests::{call, machine};
use super::*;
use crate::protocol::Decision;

/// The `seq` of the `approval_requested` event among `out` (the presentation a showing names).
fn presentation(out: &[Action]) -> u64 {
    out.iter()
        .find_map(|a| match a {
            Action::Emit(e)
                if matches!(e.kind, crate::protocol::EventKind::ApprovalRequested { .. }) =>
            {
                Some(e.seq)
            }
            _ => None,
        })
        .expect("approval requested")
}

#[test]
fn a_timer_fires_once_and_only_while_it_is_set() {
    // No deadline: a `timer_fired` for one (a driver's stale alarm) changes nothing.
    let mut m = machine(json!({}), Policy::auto());
    m.handle(RunInput::Start, 1000);
    let deadline = Timer::Deadline { frame: None };
    assert_eq!(m.timer_at(deadline), None);
    let a = m.handle(RunInput::TimerFired { timer: deadline }, 5000);
    assert!(a.is_empty(), "{a:?}");
    assert_eq!(super::tests::result(&a), None);

    // With one, the machine says when it is due, and firing it ends the run.
    let mut m = machine(json!({"limits": {"timeout_s": 2}}), Policy::auto());
    m.handle(RunInput::Start, 1000);
    assert_eq!(m.timer_at(deadline), Some(3000));
    assert_eq!(
        m.timers_by_due().collect::<Vec<_>>(),
        vec![(3000, deadline)]
    );
    let a = m.handle(RunInput::TimerFired { timer: deadline }, 3000);
    assert_eq!(
        super::tests::result(&a).map(|r| r.status),
        Some(RunStatus::Timeout)
    );
    assert_eq!(m.timer_at(deadline), None);
}

/// A reviewer's timer is set when the call is first shown and cleared when it is decided: the
/// machine's next deadline moves with it, and the actions say nothing of either.
#[test]
fn a_reviewers_timer_moves_the_next_deadline_and_a_decision_clears_it() {
    let mut policy = Policy::ask();
    policy.timeout = Some(Duration::from_secs(5));
    let mut m = machine(json!({"limits": {"timeout_s": 60}}), policy);
    m.handle(RunInput::Start, 1000);
    assert_eq!(m.poll_timeout(), Some(61_000));
    let out = m.handle(
        RunInput::Call {
            frame: None,
            call: call(json!({"_tool": "act", "x": 1})).into(),
            parsed: Default::default(),
        },
        2000,
    );
    // Presented, not shown yet: the reviewer's clock has not started.
    let approval = Timer::Approval { call: CallId(1) };
    assert_eq!(m.timer_at(approval), None);
    let shown = m.handle(
        RunInput::Shown {
            call: CallId(1),
            presentation: presentation(&out),
        },
        3000,
    );
    assert!(shown.is_empty(), "a showing asks nothing of the driver: {shown:?}");
    assert_eq!(m.poll_timeout(), Some(8000));
    assert!(m.timer_ever_set(approval));
    m.handle(
        RunInput::Decided {
            call: CallId(1),
            decision: Decision::Approve,
            by: None,
            presentation: None,
        },
        4000,
    );
    assert_eq!(m.timer_at(approval), None);
    assert_eq!(m.poll_timeout(), Some(61_000));
    // Cleared, yet once set: a late firing is admitted by a replay and ignored here.
    assert!(m.timer_ever_set(approval));
    assert!(m.handle(RunInput::TimerFired { timer: approval }, 8000).is_empty());
}

/// Logged only when asked for: each setting with the number of actions before it (the run's
/// deadline comes right after its `run_started`, before the model is asked).
#[test]
fn the_settings_log_places_each_setting_among_the_actions() {
    let mut m = machine(json!({"limits": {"timeout_s": 2}}), Policy::auto());
    m.handle(RunInput::Start, 1000);
    assert_eq!(m.take_timer_settings(), vec![]);

    let mut m = machine(json!({"limits": {"timeout_s": 2}}), Policy::auto());
    m.log_timer_settings();
    let mut out = vec![Action::Abort { id: CallId(9) }];
    m.handle_into(RunInput::Start, 1000, &mut out);
    let settings = m.take_timer_settings();
    let deadline = Timer::Deadline { frame: None };
    assert_eq!(settings.len(), 1, "{settings:?}");
    let s = settings[0];
    assert_eq!((s.timer, s.at), (deadline, 3000));
    assert!(
        matches!(&out[s.position - 1], Action::Emit(e)
            if matches!(e.kind, crate::protocol::EventKind::RunStarted { .. })),
        "{out:?}"
    );
    assert_eq!(s.position, 2, "after the driver's own action and `run_started`");
    assert!(
        out[s.position..]
            .iter()
            .any(|a| matches!(a, Action::Request { .. })),
        "the model is asked after it: {out:?}"
    );
    // Taken once.
    assert_eq!(m.take_timer_settings(), vec![]);
}
