//! Room kept on the store's file system so that a process can still give a run's lease back
//! when the disk fills up: a file of [`RESERVE_BYTES`] beside the store (`STORE-reserve`),
//! written by the first process that commits to the store. When a write that gives a lease up
//! (release, park, a run's end) fails, the writer deletes the file and tries that write once
//! more in the room it freed; once the store is idle again it writes the file back if it can.
//!
//! Without it, a run stopped by a full disk (its journal could not be written) kept its lease
//! in the row: the process that ended was taken over at once only by processes on its own
//! host, and `dagloop runs` on any other saw it driven until the lease ran out.
//!
//! Deliberately not here: deciding which writes give a lease up, or what a failed write means
//! to the run (the writer's and the driver's).

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// How much room the reserve keeps: a release or park changes a few pages (the run's row and
/// its index entries), each one WAL frame; a run's end also writes its result. 256 KiB holds
/// them many times over.
pub(super) const RESERVE_BYTES: usize = 256 << 10;

/// The reserve of one store, as this process's writer sees it.
pub(super) struct Reserve {
    path: PathBuf,
    /// The file is known to be there (this process wrote it or found it) and not spent since.
    held: bool,
}

impl Reserve {
    /// The reserve beside the store at `store` (nothing is written yet).
    pub(super) fn new(store: &Path) -> Reserve {
        let mut name = store.as_os_str().to_owned();
        name.push("-reserve");
        Reserve {
            path: PathBuf::from(name),
            held: false,
        }
    }

    /// Makes sure the file is there: written in full, or not at all (a disk without the room
    /// keeps none, and the next call tries again). Cheap once it is held.
    pub(super) fn keep(&mut self) {
        if self.held {
            return;
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&self.path);
        self.held = match file {
            Ok(mut file) => {
                let written = file.write_all(&vec![0u8; RESERVE_BYTES]).is_ok();
                if !written {
                    drop(file);
                    let _ = std::fs::remove_file(&self.path);
                }
                written
            }
            // Another process (or an earlier one) keeps it already.
            Err(e) => e.kind() == std::io::ErrorKind::AlreadyExists,
        };
    }

    /// Frees the room for a write that gives a lease up; true when the file was there.
    pub(super) fn spend(&mut self) -> bool {
        self.held = false;
        std::fs::remove_file(&self.path).is_ok()
    }
}
