//! The process behind a lease: which host it runs on (the kernel's boot id and the process's
//! PID namespace), its process id and its start time. A lease records them so that a process on
//! the same host can tell at once that the owner of a run is gone (it crashed, it was killed)
//! and take the run over without waiting for the lease to expire.
//!
//! A PID alone never decides: the start time (from `/proc/PID/stat`, in clock ticks since boot)
//! tells a reused PID from the owner, and a process on another host, in another PID namespace
//! (a container), or on a system without `/proc` reads as unknown, where only the lease's
//! expiry decides.
//!
//! Deliberately not here: the lease itself (the store's row) or who may claim it (the store's
//! `claim`).

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// The process that holds a lease, as recorded with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerProcess {
    /// The host: its boot id and the PID namespace the process id belongs to
    /// (`BOOT_ID/pid:[INODE]`). Two processes on one host (and namespace) agree on it.
    pub host: String,
    /// The process id.
    pub pid: u32,
    /// When the process started, in clock ticks since boot (`/proc/PID/stat`, field 22).
    pub started: u64,
}

impl OwnerProcess {
    /// This process, when the host can be told (Linux with `/proc`); `None` otherwise.
    pub fn current() -> Option<&'static OwnerProcess> {
        static ME: OnceLock<Option<OwnerProcess>> = OnceLock::new();
        ME.get_or_init(|| {
            let pid = std::process::id();
            Some(OwnerProcess {
                host: host()?,
                pid,
                started: started(pid)?.1,
            })
        })
        .as_ref()
    }

    /// True only when this process can tell for sure that the owner is gone: it ran on this
    /// host, and no process with its id and start time is alive (none has the id, one that
    /// has it started at another time, or it is a zombie). Anything uncertain is alive.
    pub fn is_gone(&self) -> bool {
        let Some(me) = OwnerProcess::current() else {
            return false;
        };
        if self.host != me.host || self.pid == me.pid {
            return false;
        }
        let Ok(pid) = i32::try_from(self.pid) else {
            return false;
        };
        if pid <= 1 {
            return false;
        }
        // Signal 0 checks that a process exists, whoever it belongs to. (Without Unix there is
        // no `/proc` either, so `current` is `None` and this is never reached.)
        #[cfg(unix)]
        if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            == Err(nix::errno::Errno::ESRCH)
        {
            return true;
        }
        match started(self.pid) {
            Some((state, at)) => matches!(state, 'Z' | 'X') || at != self.started,
            // It exists but cannot be read (`hidepid`): not known to be gone.
            None => false,
        }
    }
}

/// `BOOT_ID/pid:[INODE]`: the kernel's boot id and this process's PID namespace.
fn host() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let boot = boot.trim();
    (!boot.is_empty()).then(|| format!("{boot}/{}", ns.display()))
}

/// The state letter and start time of process `pid`, from `/proc/PID/stat`.
fn started(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat)
}

/// Field 3 (state) and field 22 (start time) of a `/proc/PID/stat` line. The command name
/// (field 2, in parentheses) may hold spaces and parentheses itself: fields are counted from
/// the last `)`.
fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields 4 to 21 come between the state and the start time.
    let at = fields.nth(18)?.parse().ok()?;
    Some((state, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_read_after_the_last_parenthesis() {
        let line =
            "4121 (a) b) (c) S 1 4121 4121 0 -1 4194560 10 0 0 0 1 2 0 0 20 0 1 0 987654 1000 200";
        assert_eq!(parse_stat(line), Some(('S', 987_654)));
        assert_eq!(parse_stat("12 (x) Z 1"), None);
    }

    #[test]
    fn this_process_is_alive_and_a_reused_pid_or_a_gone_one_is_not_the_owner() {
        let Some(me) = OwnerProcess::current() else {
            return; // no /proc: nothing is decided from processes
        };
        assert!(!me.is_gone(), "this process");
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let pid = child.id();
        let (_, started) = super::started(pid).expect("stat");
        let other = OwnerProcess {
            host: me.host.clone(),
            pid,
            started,
        };
        child.wait().expect("wait");
        assert!(other.is_gone(), "an exited process");
        let reused = OwnerProcess {
            started: me.started + 1,
            ..me.clone()
        };
        // The same pid as this process is never taken for a dead owner.
        assert!(!reused.is_gone());
        let parent = std::os::unix::process::parent_id();
        let (_, at) = super::started(parent).expect("parent");
        let reused = OwnerProcess {
            host: me.host.clone(),
            pid: parent,
            started: at + 1,
        };
        assert!(reused.is_gone(), "another start time: a reused pid");
        let elsewhere = OwnerProcess {
            host: "another-boot/pid:[1]".into(),
            pid: 999_999_999,
            started: 1,
        };
        assert!(!elsewhere.is_gone(), "another host is never judged");
    }
}
