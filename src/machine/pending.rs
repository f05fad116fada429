//! What a run waits on: the timers set and not yet fired or cleared (the machine's only record
//! of them: it sets and clears them where it decides to, and no action announces them), and how
//! many requests each model has been asked. A driver reads both off the machine, live or after
//! replaying a journal.
//!
//! Deliberately not here: arming a sleep for the next timer or asking a model (the driver's), or
//! deciding anything (the count is bookkeeping, read only when a run is rebuilt).

use std::collections::{BTreeMap, BTreeSet};

use super::{Action, FrameKey, RunInput, Timer};
use crate::protocol::Millis;

/// A model of a run: its agent's model list (None: the run's own) and its position in it.
pub type ModelKey = (Option<String>, usize);

/// How many requests one model ([`ModelKey`]) has had: the machine's one answer to "how many
/// requests has model N had", retries, re-asks and fallbacks included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requests {
    /// Requests made of it, those streaming now included.
    pub made: usize,
    /// Of those, the turns streaming from it now (not answered yet: a rebuilt run asks them
    /// again).
    pub streaming: usize,
}

impl Requests {
    /// The requests it answered: made, less those still streaming. What a rebuilt run's model
    /// is told it already answered, so that a scripted or replayed model goes on where it was.
    pub fn answered(self) -> usize {
        self.made.saturating_sub(self.streaming)
    }
}

/// One setting of a timer, as [`super::RunMachine::take_timer_settings`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerSetting {
    /// How many actions the machine had appended to the driver's buffer when it set the
    /// timer: the setting comes after those and before the next.
    pub position: usize,
    /// Which timer.
    pub timer: Timer,
    /// When it is due (milliseconds since the Unix epoch).
    pub at: Millis,
}

#[derive(Debug, Default)]
pub(super) struct Pending {
    timers: BTreeMap<Timer, Millis>,
    /// The same timers by when each is due, earliest first.
    due: BTreeSet<(Millis, Timer)>,
    /// Every timer ever set (a replay admits a late `timer_fired` of one since cleared).
    ever: BTreeSet<Timer>,
    /// When on ([`Pending::log_settings`]): each setting, with the number of actions the
    /// machine had returned before it, until a driver takes them.
    settings: Option<Vec<TimerSetting>>,
    requests: BTreeMap<ModelKey, usize>,
    /// The model each agent was last asked.
    frame_model: BTreeMap<FrameKey, ModelKey>,
}

impl Pending {
    /// Takes an input before the machine handles it.
    pub(super) fn input(&mut self, input: &RunInput) {
        match input {
            RunInput::TimerFired { timer } => self.clear(*timer),
            // A retry or a re-ask inside a turn asked the same model once more.
            RunInput::Retry { frame, .. } | RunInput::Reask { frame, .. } => {
                let model = self.frame_model.get(frame).cloned().unwrap_or_default();
                *self.requests.entry(model).or_default() += 1;
            }
            // The turn moved to the next model of its list, which was asked.
            RunInput::Fallback { frame, index, .. } => {
                let list = self.frame_model.get(frame).and_then(|m| m.0.clone());
                let model = (list, *index);
                *self.requests.entry(model.clone()).or_default() += 1;
                self.frame_model.insert(*frame, model);
            }
            _ => {}
        }
    }

    /// Sets `timer` to fire at `at` (replacing an earlier setting of it); `position` is how
    /// many actions the driver's buffer held when the machine decided it.
    pub(super) fn set(&mut self, timer: Timer, at: Millis, position: usize) {
        self.clear(timer);
        self.timers.insert(timer, at);
        self.due.insert((at, timer));
        self.ever.insert(timer);
        if let Some(log) = self.settings.as_mut() {
            log.push(TimerSetting {
                position,
                timer,
                at,
            });
        }
    }

    /// Starts logging settings ([`Pending::take_settings`]).
    pub(super) fn log_settings(&mut self) {
        self.settings.get_or_insert_with(Vec::new);
    }

    /// The settings logged since the last call.
    pub(super) fn take_settings(&mut self) -> Vec<TimerSetting> {
        self.settings.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// True when `timer` was ever set.
    pub(super) fn ever_set(&self, timer: Timer) -> bool {
        self.ever.contains(&timer)
    }

    /// Takes the actions the machine returned for an input.
    pub(super) fn actions(&mut self, actions: &[Action]) {
        for a in actions {
            if let Action::Request {
                frame,
                config,
                model,
                ..
            } = a
            {
                let key = (config.model.clone(), *model);
                *self.requests.entry(key.clone()).or_default() += 1;
                self.frame_model.insert(*frame, key);
            }
        }
    }

    /// A turn that was streaming when the run stopped is asked again after a restart
    /// ([`RunInput::Resumed`]): the same request, already counted, which the `Request` action
    /// asking it again would count twice.
    pub(super) fn reasked(&mut self, model: &ModelKey) {
        if let Some(n) = self.requests.get_mut(model) {
            *n = n.saturating_sub(1);
        }
    }

    /// Forgets `timer` (nothing when it is not set).
    pub(super) fn clear(&mut self, timer: Timer) {
        if let Some(at) = self.timers.remove(&timer) {
            self.due.remove(&(at, timer));
        }
    }

    pub(super) fn timers(&self) -> impl Iterator<Item = (Timer, Millis)> + '_ {
        self.timers.iter().map(|(t, at)| (*t, *at))
    }

    /// The pending timers, earliest due first.
    pub(super) fn by_due(&self) -> impl Iterator<Item = (Millis, Timer)> + '_ {
        self.due.iter().copied()
    }

    /// When `timer` is due, if it is set.
    pub(super) fn timer_at(&self, timer: Timer) -> Option<Millis> {
        self.timers.get(&timer).copied()
    }

    pub(super) fn requests(&self) -> &BTreeMap<ModelKey, usize> {
        &self.requests
    }
}
