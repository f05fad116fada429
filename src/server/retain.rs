//! `dagloop serve` applies the config's retention policy (`[store] retain`, `compact_after`):
//! once at start, then every [`super::RETENTION_EVERY`], on a blocking thread, through the
//! same `runs::apply_retention` as `dagloop runs prune`.
//!
//! Deliberately not here: the rules (only finished runs are deleted or compacted; see
//! `runs::compact`).

use std::sync::Arc;

use super::state::AppState;

impl AppState {
    /// The retention task, when the policy does anything.
    pub(super) fn spawn_retention(
        self: &Arc<Self>,
        policy: crate::store::Retention,
    ) -> Option<tokio::task::JoinHandle<()>> {
        if policy.is_empty() {
            return None;
        }
        let me = self.clone();
        Some(tokio::spawn(async move {
            loop {
                let store = me.store.clone();
                let done = tokio::task::spawn_blocking(move || {
                    crate::runs::apply_retention(&*store, &policy, crate::runs::now_ms())
                })
                .await;
                match done {
                    Ok(Ok(d)) if d.deleted + d.compacted > 0 || !d.failed.is_empty() => {
                        tracing::info!(
                            deleted = d.deleted,
                            compacted = d.compacted,
                            journal_bytes_dropped = d.journal_bytes_dropped,
                            failed = d.failed.len(),
                            "retention applied"
                        );
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!("retention not applied: {e}"),
                    Err(e) => tracing::warn!("retention not applied: {e}"),
                }
                tokio::time::sleep(super::RETENTION_EVERY).await;
            }
        }))
    }
}
