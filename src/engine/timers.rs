//! The driver's alarm clock for the machine's timers. The machine owns the timers (which are
//! set, and when each is due: [`RunMachine::timers_by_due`]); the alarm only keeps one tokio
//! sleep armed for the earliest, and remembers which timers it fired whose `timer_fired` input
//! has not reached the machine yet (it waits in the driver's queue or in a commit), so that it
//! does not fire them twice.
//!
//! Deliberately not here: a table of deadlines (the machine's), or what a timer means.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use crate::machine::{RunMachine, Timer};
use crate::protocol::Millis;

pub(super) struct Alarm {
    sleep: Pin<Box<Sleep>>,
    armed_for: Option<Millis>,
    /// Fired, their `timer_fired` not yet handed to the machine.
    fired: BTreeSet<Timer>,
}

impl Default for Alarm {
    fn default() -> Self {
        Alarm {
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed_for: None,
            fired: BTreeSet::new(),
        }
    }
}

impl Alarm {
    /// When the earliest timer the alarm has not fired yet is due.
    pub fn next_at(&self, machine: &RunMachine) -> Option<Millis> {
        machine
            .timers_by_due()
            .find(|(_, t)| !self.fired.contains(t))
            .map(|(at, _)| at)
    }

    /// Waits until `at` (`now` reads the engine's clock). Cancel-safe.
    pub async fn wait(&mut self, at: Millis, now: Millis) {
        if self.armed_for != Some(at) {
            let delay = Duration::from_millis(at.saturating_sub(now));
            self.sleep.as_mut().reset(Instant::now() + delay);
            self.armed_for = Some(at);
        }
        self.sleep.as_mut().await;
    }

    /// The timers to fire now that the sleep for the earliest ended: that one, and every other
    /// one due at `now`. They are not fired again until [`Alarm::handed`] says the machine has
    /// taken their input.
    pub fn fire(&mut self, machine: &RunMachine, now: Millis) -> Vec<Timer> {
        let mut out = Vec::new();
        for (at, timer) in machine.timers_by_due() {
            if self.fired.contains(&timer) {
                continue;
            }
            if !out.is_empty() && at > now {
                break;
            }
            out.push(timer);
        }
        self.fired.extend(out.iter().copied());
        self.armed_for = None;
        out
    }

    /// The machine is about to handle `timer`'s `timer_fired` input.
    pub fn handed(&mut self, timer: Timer) {
        self.fired.remove(&timer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approval::Policy;
    use crate::context::SanitizeLimits;
    use crate::machine::RunInput;

    fn machine_with_deadline() -> RunMachine {
        let goal = crate::goal::Goal::from_json(
            r#"{"goal": "g", "output_schema": {}, "limits": {"timeout_s": 2}}"#,
            "t.json".as_ref(),
            ".".into(),
        )
        .expect("goal");
        let config = crate::runs::RunDef::from_goal(goal)
            .expect("def")
            .config()
            .expect("config");
        let mut m = RunMachine::new("run-t", config, Policy::auto(), SanitizeLimits::default());
        m.handle(RunInput::Start, 1000);
        m
    }

    #[tokio::test]
    async fn a_fired_timer_is_not_fired_again_until_the_machine_has_taken_it() {
        let m = machine_with_deadline();
        let deadline = Timer::Deadline { frame: None };
        let mut alarm = Alarm::default();
        assert_eq!(alarm.next_at(&m), Some(3000));
        // Not due yet: the earliest is fired anyway (its sleep ended), nothing else.
        assert_eq!(alarm.fire(&m, 3000), vec![deadline]);
        // Its `timer_fired` waits to be journaled: the machine still has it set, the alarm
        // neither sleeps for it nor fires it a second time.
        assert_eq!(alarm.next_at(&m), None);
        assert_eq!(alarm.fire(&m, 5000), Vec::<Timer>::new());
        // Handed to the machine (which here, unlike a real run, keeps it set): due again.
        alarm.handed(deadline);
        assert_eq!(alarm.next_at(&m), Some(3000));
    }
}
