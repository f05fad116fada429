//! Process groups of the programs tools start (shell tools, stdio MCP servers): each program
//! runs as the leader of a group of its own, and [`KillOnDrop`] kills the whole group when it
//! is dropped, so whatever the program started in the background goes with it.
//!
//! Every guarded group is also listed process-wide until it has been killed: [`kill_all`]
//! kills what is left (SIGKILL) on the way out of the process, so a group whose guard could not
//! be dropped (the process leaves with `std::process::exit`) or whose grace period has not
//! ended yet is not left behind either.
//!
//! A process killed outright (SIGKILL, the OOM killer) runs none of that, so the list is also
//! kept by a **reaper**: a tiny `sh` process, started with the first guarded group, in a group
//! of its own and deaf to SIGINT, SIGTERM and SIGHUP, that reads `+ PGID` and `- PGID` lines
//! from a pipe only this process writes. When this process is gone, however it went, the pipe
//! reads end-of-file and the reaper kills every group still listed, then exits. (Not
//! `PR_SET_PDEATHSIG`: it fires when the *thread* that spawned the program exits, and tokio
//! spawns from threads that come and go; and it reaches only the group's leader, not what the
//! leader started.) A group started in the instant before the process was killed, before the
//! reaper heard of it, is the one gap.
//!
//! The programs are set up here ([`prepare`]): a group of their own and, when the `dagloop`
//! binary turned transparent huge pages off for itself (`cli::alloc`; the flag is inherited
//! across fork and exec), those pages back on, so that a tool runs as it would from a shell.
//!
//! Deliberately not here: starting the programs (their callers do, after [`prepare`]), or
//! waiting for them.

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// The process turned transparent huge pages off for itself only: the programs it starts get
/// them back ([`prepare`]).
static THP_FOR_CHILDREN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Called by whoever turned transparent huge pages off for this process
/// (`PR_SET_THP_DISABLE`, which fork and exec pass on) when they were on before: the programs
/// [`prepare`]d from now on start with them on again.
pub fn huge_pages_for_children() {
    THP_FOR_CHILDREN.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Sets up a program a tool starts (a shell tool's command, a stdio MCP server): the leader of
/// a process group of its own (see [`KillOnDrop`]), with transparent huge pages as the system
/// has them rather than as this process turned them (see [`huge_pages_for_children`]).
pub(crate) fn prepare(cmd: &mut tokio::process::Command) {
    cmd.process_group(0);
    huge_pages_back(cmd.as_std_mut());
}

/// The program `cmd` starts gets transparent huge pages as the system has them, when this
/// process turned them off for itself only (see [`huge_pages_for_children`]): a tool's program,
/// or the reviewer's `$EDITOR`.
pub fn huge_pages_back(cmd: &mut std::process::Command) {
    #[cfg(not(target_os = "linux"))]
    let _ = cmd;
    #[cfg(target_os = "linux")]
    if THP_FOR_CHILDREN.load(std::sync::atomic::Ordering::Relaxed) {
        use std::os::unix::process::CommandExt;
        // SAFETY: the hook runs between fork and exec and makes one system call (prctl, with
        // integer arguments), which is async-signal-safe; it allocates nothing and takes no
        // lock. A failure leaves the flag as inherited, which only costs the program memory.
        unsafe {
            cmd.pre_exec(|| {
                nix::libc::prctl(nix::libc::PR_SET_THP_DISABLE, 0, 0, 0, 0);
                Ok(())
            });
        }
    }
}

/// The guarded groups not yet killed with SIGKILL, and the reaper that keeps the same list.
struct Groups {
    live: BTreeSet<i32>,
    /// The reaper's pipe (None: not started yet, or it could not be started, or it is gone).
    reaper: Option<std::process::ChildStdin>,
    /// Starting the reaper was tried (it is tried once per process).
    tried: bool,
}

static GROUPS: Mutex<Groups> = Mutex::new(Groups {
    live: BTreeSet::new(),
    reaper: None,
    tried: false,
});

fn groups() -> std::sync::MutexGuard<'static, Groups> {
    match GROUPS.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// The reaper's program: keeps the listed groups, and kills those still listed at end-of-file.
const REAPER: &str = r#"trap '' INT TERM HUP
live=' '
while read -r op pg; do
  case $op in
    +) live="$live$pg " ;;
    -) case $live in *" $pg "*) live="${live%% $pg *} ${live#* $pg }" ;; esac ;;
  esac
done
for pg in $live; do kill -s KILL -- "-$pg" 2>/dev/null; done
"#;

fn start_reaper() -> Option<std::process::ChildStdin> {
    use std::os::unix::process::CommandExt;
    let mut child = std::process::Command::new("/bin/sh")
        .args(["-c", REAPER])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .current_dir("/")
        // Its own group: a Ctrl-C at the terminal, or a kill of this process's group, does
        // not reach it.
        .process_group(0)
        .spawn()
        .map_err(|e| tracing::warn!("cannot start the process-group reaper: {e}"))
        .ok()?;
    // Never waited for: it exits only once this process is gone (its parent is then init).
    child.stdin.take()
}

/// Starts the reaper if it has not been started yet. Callers call it just before they start a
/// program, so that the reaper is told of the new group the moment it exists (starting the
/// reaper only then would widen the gap in which a killed dagloop leaves the group behind).
pub(crate) fn arm() {
    groups().arm();
}

impl Groups {
    fn arm(&mut self) {
        if !self.tried {
            self.tried = true;
            self.reaper = start_reaper();
        }
    }

    fn add(&mut self, pgid: i32) {
        self.live.insert(pgid);
        self.arm();
        self.tell('+', pgid);
    }

    fn remove(&mut self, pgid: i32) -> bool {
        let was = self.live.remove(&pgid);
        if was {
            self.tell('-', pgid);
        }
        was
    }

    /// One line to the reaper (written under the lock, so that lines about one group id keep
    /// their order); a reaper that is gone is forgotten.
    fn tell(&mut self, op: char, pgid: i32) {
        if let Some(w) = self.reaper.as_mut()
            && w.write_all(format!("{op} {pgid}\n").as_bytes()).is_err()
        {
            self.reaper = None;
        }
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
            groups().add(g);
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
    let mut g = groups();
    if g.live.contains(&pgid) {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        g.remove(pgid);
    }
}

/// Kills (SIGKILL) every guarded group not killed yet, those in their grace period included.
/// For the way out of the process: call it after the runtime has been dropped, just before
/// `std::process::exit`.
pub fn kill_all() {
    let mut g = groups();
    let live = std::mem::take(&mut g.live);
    for pgid in live {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        g.tell('-', pgid);
    }
}
