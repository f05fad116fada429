//! Process groups of the programs tools start (shell tools, stdio MCP servers): each program
//! runs as the leader of a group of its own, and [`KillOnDrop`] kills the whole group when it
//! is dropped, so whatever the program started in the background goes with it.
//!
//! Every guarded group is also listed process-wide until it has been killed: [`kill_all`]
//! kills what is left (SIGKILL) on the way out of the process, so a group whose guard could not
//! be dropped (the process leaves with `std::process::exit`) or whose grace period has not
//! ended yet is not left behind either.
//!
//! Deliberately not here: starting the programs (their callers do, with `process_group(0)`),
//! or waiting for them.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// The groups guarded and not yet killed with SIGKILL.
static LIVE: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

fn live() -> std::sync::MutexGuard<'static, BTreeSet<i32>> {
    match LIVE.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Kills a process group when dropped: at once with SIGKILL, or first SIGTERM and SIGKILL after
/// a grace period.
#[derive(Debug)]
pub struct KillOnDrop {
    pgid: Option<i32>,
    grace: Duration,
}

impl KillOnDrop {
    /// Guards the group led by the process `pid` (a program started with `process_group(0)`);
    /// `None` (the program already exited, as tokio reports it) guards nothing. Dropped, it
    /// sends SIGKILL to the group.
    pub fn new(pid: Option<u32>) -> KillOnDrop {
        KillOnDrop::with_grace(pid, Duration::ZERO)
    }

    /// [`KillOnDrop::new`], sending SIGTERM first and SIGKILL `grace` later (from a thread of
    /// its own, or from [`kill_all`] if the process leaves before).
    pub fn with_grace(pid: Option<u32>, grace: Duration) -> KillOnDrop {
        // pid 0 or 1 (or one past `pid_t`) would name far more than the group.
        let pgid = pid.and_then(|p| i32::try_from(p).ok()).filter(|p| *p > 1);
        if let Some(g) = pgid {
            live().insert(g);
        }
        KillOnDrop { pgid, grace }
    }

    /// Kills the group now (see [`KillOnDrop::with_grace`]); later calls and the drop do nothing.
    pub fn kill(&mut self) {
        let Some(pgid) = self.pgid.take() else { return };
        if !self.grace.is_zero() {
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGTERM);
            let grace = self.grace;
            let spawned = std::thread::Builder::new()
                .name("dagloop-killpg".into())
                .spawn(move || {
                    std::thread::sleep(grace);
                    final_kill(pgid);
                });
            if spawned.is_ok() {
                return;
            }
        }
        final_kill(pgid);
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.kill();
    }
}

/// SIGKILL to the group, unless [`kill_all`] (or an earlier call) already sent it.
fn final_kill(pgid: i32) {
    if live().remove(&pgid) {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

/// Kills (SIGKILL) every guarded group not killed yet, those in their grace period included.
/// For the way out of the process: call it after the runtime has been dropped, just before
/// `std::process::exit`.
pub fn kill_all() {
    let groups = std::mem::take(&mut *live());
    for g in groups {
        let _ = killpg(Pid::from_raw(g), Signal::SIGKILL);
    }
}
