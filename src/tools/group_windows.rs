//! The Windows counterpart of `group.rs` (same API): each program a tool starts (a shell
//! tool's command, a stdio MCP server) is put in a **Job object** created for it, with
//! `JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE`, so the processes it starts belong to the job too and
//! go with it. [`KillOnDrop`] terminates the job when dropped.
//!
//! The reaper of the Unix side is not needed: the job's only handle is this process's, and
//! Windows closes it when the process ends however it ends (killed from Task Manager
//! included), which kills what is left in the job. So [`kill_all`] has nothing to do.
//!
//! Differences from Unix, as the platform has them: there is no SIGTERM, so a grace period
//! is not kept (the job is terminated at once); and the program is put in the job just after
//! it started, so a process it started in that instant (before `AssignProcessToJobObject`) is
//! outside the job — the gap the Unix side has between the start and the reaper hearing of
//! the group. A program that cannot be put in a job (access denied) is only killed itself
//! (tokio's `kill_on_drop`), as before there were jobs.
//!
//! Deliberately not here: starting the programs, or waiting for them.

use std::time::Duration;

use windows_sys::Win32::Foundation::{CloseHandle, FALSE, HANDLE};
use windows_sys::Win32::System::JobObjects::{
    AssignProcessToJobObject, CreateJobObjectW, JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
    JOBOBJECT_EXTENDED_LIMIT_INFORMATION, JobObjectExtendedLimitInformation,
    SetInformationJobObject, TerminateJobObject,
};
use windows_sys::Win32::System::Threading::{OpenProcess, PROCESS_SET_QUOTA, PROCESS_TERMINATE};

/// Transparent huge pages are a Linux matter: nothing to hand back to children here.
pub fn huge_pages_for_children() {}

/// Transparent huge pages are a Linux matter: a program started here (a tool's, the reviewer's
/// `$EDITOR`) needs nothing handed back.
pub fn huge_pages_back(_cmd: &mut std::process::Command) {}

/// Sets up a program a tool starts: nothing before the start on Windows (the job is joined
/// right after it, in [`KillOnDrop::new`]).
pub(crate) fn prepare(_cmd: &mut tokio::process::Command) {}

/// Nothing to start ahead of the program on Windows (no reaper: see the module's doc).
pub(crate) fn arm() {}

/// Terminates the job the program was put in when dropped: the program and every process it
/// started since.
#[derive(Debug)]
pub struct KillOnDrop {
    /// The job's handle, as an integer (a raw handle is not `Send`); `None`: nothing guarded.
    job: Option<usize>,
}

impl KillOnDrop {
    /// Guards the process `pid` and what it starts from now on; `None` (the program already
    /// exited) guards nothing.
    pub fn new(pid: Option<u32>) -> KillOnDrop {
        KillOnDrop {
            job: pid.and_then(job_for).map(|h| h as usize),
        }
    }

    /// [`KillOnDrop::new`]: Windows has no SIGTERM to send first, so no grace period is kept.
    pub fn with_grace(pid: Option<u32>, _grace: Duration) -> KillOnDrop {
        KillOnDrop::new(pid)
    }

    /// Terminates the job now; later calls and the drop do nothing.
    pub fn kill(&mut self) {
        let Some(job) = self.job.take() else { return };
        let job = job as HANDLE;
        // SAFETY: `job` is a job handle this guard created and owns; it is closed once, here.
        unsafe {
            TerminateJobObject(job, 1);
            CloseHandle(job);
        }
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A new job with `KILL_ON_JOB_CLOSE` holding process `pid`; `None` when any step fails.
fn job_for(pid: u32) -> Option<HANDLE> {
    // SAFETY: plain Win32 calls on handles created here; every handle is closed on every path
    // except the job's, which is returned to its owner.
    unsafe {
        let job = CreateJobObjectW(std::ptr::null(), std::ptr::null());
        if job.is_null() {
            return None;
        }
        let mut limits: JOBOBJECT_EXTENDED_LIMIT_INFORMATION = std::mem::zeroed();
        limits.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
        let set = SetInformationJobObject(
            job,
            JobObjectExtendedLimitInformation,
            std::ptr::from_ref(&limits).cast(),
            std::mem::size_of::<JOBOBJECT_EXTENDED_LIMIT_INFORMATION>() as u32,
        );
        let process = OpenProcess(PROCESS_SET_QUOTA | PROCESS_TERMINATE, FALSE, pid);
        let assigned =
            set != 0 && !process.is_null() && AssignProcessToJobObject(job, process) != 0;
        if !process.is_null() {
            CloseHandle(process);
        }
        if assigned {
            Some(job)
        } else {
            CloseHandle(job);
            None
        }
    }
}

/// Nothing to do on Windows: each job dies with its handle, which Windows closes when this
/// process ends (see the module's doc).
pub fn kill_all() {}
