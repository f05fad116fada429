//! A run's events as Server-Sent Events: each event's `id` is its sequence number, so a client
//! that reconnects with `Last-Event-ID` continues without gap or duplicate (the run's
//! subscription replays the journal for what it missed). The stream ends after `run_finished`.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::stream::{self, BoxStream, StreamExt};

use super::error::ApiError;
use super::principals::Principal;
use super::state::AppState;
use crate::protocol::Event;

#[derive(serde::Deserialize)]
pub(super) struct After {
    /// Resume after this sequence number (for clients that cannot send `Last-Event-ID`).
    after: Option<u64>,
}

fn frame(e: &Event) -> Result<SseEvent, Infallible> {
    Ok(SseEvent::default()
        .id(e.seq.to_string())
        .event(e.kind.name())
        .data(serde_json::to_string(e).unwrap_or_default()))
}

/// The run's events from the start, or after `Last-Event-ID` (or `?after=`), then live ones.
#[utoipa::path(get, path = "/runs/{id}/events", tag = "runs",
    params(("id" = String, Path, description = "The run id"),
           ("after" = Option<u64>, Query, description = "Start after this sequence number (the `Last-Event-ID` header does the same)"),
           ("X-Dagloop-Ticket" = Option<String>, Header, description = "A single-use ticket from POST /tickets (the browser sends it as the `dagloop_ticket` cookie); never in the URL")),
    responses((status = 200, description = "text/event-stream: `id` = sequence number, `event` = event type, `data` = the event as JSON", content_type = "text/event-stream", body = crate::protocol::Event),
              (status = 401, description = "No or wrong token, a ticket that is used, expired or for another run, or a ticket in the URL", body = ApiError),
              (status = 404, description = "No such run (or not one the caller may read)", body = ApiError),
              (status = 410, description = "The run was compacted: its journal is gone (`store.compacted`)", body = ApiError),
              (status = 429, description = "The caller already holds as many open event streams as one principal may (`server.too_many_open`)", body = ApiError)))]
pub(super) async fn events(
    State(st): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    Query(q): Query<After>,
    headers: HeaderMap,
) -> Result<impl axum::response::IntoResponse, ApiError> {
    st.readable(&who, &id).await?;
    // The stream takes one of the caller's slots until it closes (`limits`).
    let held = st.open.hold(&who, "streams")?;
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .or(q.after)
        .unwrap_or(0);
    #[cfg(feature = "temporal")]
    if let Some(t) = st.temporal() {
        let stream = t.events(id, after, frame).map(move |e| {
            let _ = &held;
            e
        });
        return Ok(Sse::new(stream.boxed()).keep_alive(KeepAlive::default()));
    }
    // A run this server parked is woken for its follower: a followed run is not parked, so the
    // stream stays live (spec/server.md H19).
    let live = match st.live(&id) {
        Some(l) => Some(l),
        None if st.wake(&id).await => st.live(&id),
        None => None,
    };
    let stream: BoxStream<'static, Result<SseEvent, Infallible>> = match live {
        Some(live) => {
            let sub = live.handle.subscribe_from(after);
            stream::unfold(sub, |mut sub| async move {
                loop {
                    let e = sub.recv().await?;
                    if !e.kind.is_ephemeral() {
                        return Some((frame(&e), sub));
                    }
                }
            })
            .boxed()
        }
        None => {
            // Nobody drives it here: what its journal holds, then the end.
            let store = st.store.clone();
            let run = id.clone();
            let events = tokio::task::spawn_blocking(move || -> Result<Vec<Event>, ApiError> {
                use crate::store::RunStore;
                let s = store.load(&run).map_err(|e| ApiError::from_store(&e))?;
                let rb = crate::runs::rebuild(&s.record, &s.journal).map_err(|e| {
                    ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.code(), e)
                })?;
                Ok(rb.events)
            })
            .await
            .map_err(|e| {
                ApiError::new(
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    "server.internal",
                    e,
                )
            })??;
            let frames: Vec<_> = events
                .iter()
                .filter(|e| e.seq > after && !e.kind.is_ephemeral())
                .map(frame)
                .collect();
            stream::iter(frames).boxed()
        }
    };
    let stream = stream.map(move |e| {
        let _ = &held;
        e
    });
    Ok(Sse::new(stream.boxed()).keep_alive(KeepAlive::default()))
}
