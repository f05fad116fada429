//! `GET /runs`: the run list, answered from the runs' rows in one query (no journal is read):
//! filtered by status and text, waiting runs first then newest, a page at a time with a
//! `Link: <...>; rel="next"` header while more follow.
//!
//! Deliberately not here: how a status is derived (`store::derive_status`) or the query's SQL
//! (the store's).

use std::sync::Arc;

use super::wire::RunSummary;
use axum::Extension;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::principals::{Principal, Role};
use super::state::AppState;
use crate::store::RunQuery;

/// Runs the caller may see (a submitter: its own), waiting first then newest: `id`, `status`,
/// `title`, `awaiting`, `created_at`, `updated_at`, `entries`, `submitted_by`.
#[utoipa::path(get, path = "/runs", tag = "runs",
    params(
        ("status" = Option<String>, Query, description = "Only runs with this status (comma-separated for several): waiting, running, stopped, finished (any ending), failed (any ending but success), or an ending by name"),
        ("q" = Option<String>, Query, description = "Only runs whose id or title contains this text"),
        ("limit" = Option<u32>, Query, description = "Runs per page, 1 to 500 (default 50)"),
        ("cursor" = Option<String>, Query, description = "Where the page starts: the cursor of the previous page's Link header")),
    responses(
        (status = 200, description = "A page of runs: [{id, status, title, awaiting, created_at, updated_at, entries, submitted_by?}]; `Link: </runs?...&cursor=...>; rel=\"next\"` while more follow", body = Vec<RunSummary>),
        (status = 400, description = "A bad parameter (`runs.bad_status`, `runs.bad_limit`, `runs.bad_cursor`, `runs.bad_param`)", body = ApiError)))]
pub(super) async fn list_runs(
    State(st): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    params: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(params) = params
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "runs.bad_param", e.body_text()))?;
    let mut q = RunQuery::from_params(params.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.code(), &e))?;
    if !who.may(Role::Review) {
        if !who.may(Role::Submit) {
            return Ok(Json(Vec::<RunSummary>::new()).into_response());
        }
        q.submitted_by = Some(who.name.clone());
    }
    #[cfg(feature = "temporal")]
    if let Some(t) = st.temporal() {
        return temporal_list(&st, t, &q).await;
    }
    let store = st.store.clone();
    let query = q.clone();
    let page = tokio::task::spawn_blocking(move || crate::runs::list_runs(&*store, &query))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server.internal", e))?
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.code(), &e))?;
    let runs: Vec<RunSummary> = page
        .runs
        .into_iter()
        .map(|mut row| {
            // The owner id without the process id and host it carries for the operator.
            row.owner = row
                .owner
                .map(|o| o.split_whitespace().next().unwrap_or_default().to_string());
            RunSummary {
                waiting: row.awaiting,
                row,
            }
        })
        .collect();
    let mut resp = Json(runs).into_response();
    if let Some(next) = &page.next {
        let link = format!("</runs?{}>; rel=\"next\"", q.next_params(next));
        if let Ok(h) = HeaderValue::from_str(&link) {
            resp.headers_mut().insert("link", h);
        }
    }
    Ok(resp)
}

/// The list on Temporal: the runs visibility lists (newest first, up to the most a page may
/// hold), each described by its workflow, filtered as the store filters (status, text,
/// submitter) and ordered as it orders (waiting first, then newest). One page: no cursor.
#[cfg(feature = "temporal")]
async fn temporal_list(
    st: &Arc<AppState>,
    t: &Arc<super::on_temporal::Engine>,
    q: &RunQuery,
) -> Result<Response, ApiError> {
    Ok(Json(temporal_rows(st, t, q).await?).into_response())
}

/// The runs on Temporal `q` lists (one page, as [`temporal_list`] answers it).
#[cfg(feature = "temporal")]
pub(super) async fn temporal_rows(
    st: &Arc<AppState>,
    t: &Arc<super::on_temporal::Engine>,
    q: &RunQuery,
) -> Result<Vec<RunSummary>, ApiError> {
    use futures::StreamExt;
    let ids = t.list(crate::store::MAX_LIMIT).await?;
    let views: Vec<_> = futures::stream::iter(ids)
        .map(|id| async move { st.describe_view(&id).await.ok() })
        .buffered(8)
        .collect()
        .await;
    let mut runs: Vec<RunSummary> = views
        .into_iter()
        .flatten()
        .filter(|v| {
            q.statuses.is_empty()
                || q.statuses
                    .iter()
                    .any(|f| crate::store::status_matches(&v.status, f))
        })
        .filter(|v| {
            q.text
                .as_deref()
                .is_none_or(|x| v.id.contains(x) || v.goal.contains(x))
        })
        .filter(|v| {
            q.submitted_by
                .as_deref()
                .is_none_or(|p| v.submitted_by.as_deref() == Some(p))
        })
        .map(|v| {
            let created_at = v.started_at.unwrap_or(0);
            let awaiting = v.awaiting.len() as u64;
            RunSummary {
                waiting: awaiting,
                row: crate::store::RunSummary {
                    title: crate::store::title_of(&v.goal),
                    id: v.id,
                    status: v.status,
                    awaiting,
                    created_at,
                    updated_at: created_at.saturating_add(v.duration_ms),
                    entries: v.journal_entries as u64,
                    submitted_by: v.submitted_by,
                    owner: None,
                    wake_at: None,
                    input: None,
                },
            }
        })
        .collect();
    runs.sort_by(|a, b| {
        (b.row.status == "waiting", b.row.created_at, &b.row.id).cmp(&(
            a.row.status == "waiting",
            a.row.created_at,
            &a.row.id,
        ))
    });
    runs.truncate(q.limit);
    Ok(runs)
}
