//! The journal one execution of a run hands to the next when it continues as new. Temporal
//! refuses a continue-as-new whose input passes its payload limit (2 MB by default, checked
//! against the whole input), which a long run's journal does: so a small journal is carried
//! inline, and a large one as a plan only (how many chunks, how many entries, a digest), the
//! next execution pulling each chunk from the closed previous one (its `carried_chunk` query,
//! asked by the `carried_chunk` activity) and checking the digest before it replays them.
//!
//! Deterministic (workflow code): the chunks are cut by each entry's JSON size, in order.
//!
//! Deliberately not here: when to continue as new and rebuilding the machine (the workflow),
//! asking the previous execution (the activity).

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::Carried;
use crate::machine::JournalEntry;

/// A journal at most this large (as JSON) is carried inline.
pub const INLINE_BYTES: usize = 1024 * 1024;

/// Each chunk pulled is at most this large (as JSON), unless one entry alone is larger.
pub const CHUNK_BYTES: usize = 1024 * 1024;

/// A journal carried as chunks the next execution pulls from the previous one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunked {
    /// How many chunks ([`chunk`] 0..chunks).
    pub chunks: u32,
    /// How many entries in all.
    pub entries: u64,
    /// The lowercase hex SHA-256 of the entries as JSON, one after the other.
    pub digest: String,
}

/// What the next execution gets of `journal`: the journal itself when small, else its plan.
pub fn carry(journal: &[JournalEntry]) -> Carried {
    let sizes = sizes(journal);
    if sizes.iter().sum::<usize>() <= INLINE_BYTES {
        return Carried {
            journal: journal.to_vec(),
            resume: false,
            chunked: None,
        };
    }
    Carried {
        journal: Vec::new(),
        resume: false,
        chunked: Some(Chunked {
            chunks: u32::try_from(bounds(&sizes).len()).unwrap_or(u32::MAX),
            entries: journal.len() as u64,
            digest: digest(journal),
        }),
    }
}

/// Chunk `index` of `journal` (empty past the last).
pub fn chunk(journal: &[JournalEntry], index: u32) -> Vec<JournalEntry> {
    let b = bounds(&sizes(journal));
    b.get(index as usize)
        .and_then(|r| journal.get(r.clone()))
        .map(<[JournalEntry]>::to_vec)
        .unwrap_or_default()
}

/// Whether `journal` (the chunks pulled, in order) is the one `plan` describes.
pub fn matches(plan: &Chunked, journal: &[JournalEntry]) -> bool {
    journal.len() as u64 == plan.entries && digest(journal) == plan.digest
}

fn sizes(journal: &[JournalEntry]) -> Vec<usize> {
    journal
        .iter()
        .map(|e| serde_json::to_vec(e).map_or(0, |v| v.len()))
        .collect()
}

/// Consecutive ranges of at most [`CHUNK_BYTES`] each (an entry larger alone is one range).
fn bounds(sizes: &[usize]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0usize);
    for (i, s) in sizes.iter().enumerate() {
        if i > start && bytes + s > CHUNK_BYTES {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += s;
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

fn digest(journal: &[JournalEntry]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for e in journal {
        if let Ok(v) = serde_json::to_vec(e) {
            ctx.update(&v);
        }
    }
    ctx.finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Pulls the journal `plan` describes from the previous execution `from`, chunk by chunk, each
/// by a `carried_chunk` activity (retried up to 5 times).
pub(super) async fn pull(
    ctx: &temporalio_sdk::WorkflowContext<super::RunWorkflow>,
    from: &str,
    plan: &Chunked,
) -> Result<Vec<JournalEntry>, String> {
    let mut journal = Vec::new();
    for index in 0..plan.chunks {
        let task = super::activities::ChunkTask {
            run_id: from.to_string(),
            index,
        };
        let opts = temporalio_sdk::ActivityOptions::with_start_to_close_timeout(
            std::time::Duration::from_secs(60),
        )
        .retry_policy(
            temporalio_workflow::RetryPolicy::builder()
                .maximum_attempts(5)
                .build(),
        )
        .build();
        let part = ctx
            .execute_activity(super::DagloopActivities::carried_chunk, task, opts)
            .await
            .map_err(|e| format!("chunk {index} of {}: {e:?}", plan.chunks))?;
        journal.extend(part);
    }
    Ok(journal)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::RunInput;

    fn journal(n: usize, text: usize) -> Vec<JournalEntry> {
        (0..n)
            .map(|i| JournalEntry {
                seq: i as u64 + 1,
                at: 0,
                input: RunInput::Cancel {
                    reason: "x".repeat(text),
                    by: None,
                },
            })
            .collect()
    }

    #[test]
    fn a_small_journal_is_carried_whole_a_large_one_in_chunks_that_add_up() {
        let small = journal(10, 100);
        let c = carry(&small);
        assert_eq!((c.journal.len(), c.chunked), (10, None));
        let large = journal(50, 100_000);
        let c = carry(&large);
        assert!(c.journal.is_empty());
        let plan = c.chunked.expect("chunked");
        assert!(plan.chunks >= 5, "{plan:?}");
        let mut back = Vec::new();
        for i in 0..plan.chunks {
            let part = chunk(&large, i);
            let bytes: usize = sizes(&part).iter().sum();
            assert!(bytes <= CHUNK_BYTES, "chunk {i}: {bytes}");
            back.extend(part);
        }
        assert!(chunk(&large, plan.chunks).is_empty());
        assert!(matches(&plan, &back));
        back.pop();
        assert!(!matches(&plan, &back), "one entry short");
        // An entry larger than a chunk travels alone.
        let huge = journal(3, CHUNK_BYTES + 10);
        let plan = carry(&huge).chunked.expect("chunked");
        assert_eq!(plan.chunks, 3);
    }
}
