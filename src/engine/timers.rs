//! The machine's timers: a deadline per [`Timer`], one tokio sleep armed for the earliest.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use crate::machine::Timer;
use crate::protocol::Millis;

pub(super) struct Timers {
    by_timer: BTreeMap<Timer, Millis>,
    queue: BTreeSet<(Millis, Timer)>,
    sleep: Pin<Box<Sleep>>,
    armed_for: Option<Millis>,
}

impl Default for Timers {
    fn default() -> Self {
        Timers {
            by_timer: BTreeMap::new(),
            queue: BTreeSet::new(),
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed_for: None,
        }
    }
}

impl Timers {
    pub fn set(&mut self, timer: Timer, at: Millis) {
        self.clear(timer);
        self.by_timer.insert(timer, at);
        self.queue.insert((at, timer));
    }

    pub fn clear(&mut self, timer: Timer) {
        if let Some(at) = self.by_timer.remove(&timer) {
            self.queue.remove(&(at, timer));
        }
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// When the earliest timer is due.
    pub fn next_at(&self) -> Option<Millis> {
        self.queue.first().map(|(at, _)| *at)
    }

    /// Some timer is due at `now` (it fires as soon as the driver waits).
    pub fn due(&self, now: Millis) -> bool {
        self.queue.first().is_some_and(|(at, _)| *at <= now)
    }

    /// Waits for the earliest timer (call only when not empty); `now` reads the engine's clock.
    pub async fn wait(&mut self, now: Millis) {
        let Some(&(at, _)) = self.queue.first() else {
            return std::future::pending().await;
        };
        if self.armed_for != Some(at) {
            let delay = Duration::from_millis(at.saturating_sub(now));
            self.sleep.as_mut().reset(Instant::now() + delay);
            self.armed_for = Some(at);
        }
        self.sleep.as_mut().await;
    }

    /// The timers due at `now`; the earliest is always included (its sleep ended).
    pub fn fired(&mut self, now: Millis) -> Vec<Timer> {
        let mut out = Vec::new();
        while let Some(&(at, timer)) = self.queue.first() {
            if !out.is_empty() && at > now {
                break;
            }
            self.queue.pop_first();
            self.by_timer.remove(&timer);
            out.push(timer);
        }
        self.armed_for = None;
        out
    }
}
