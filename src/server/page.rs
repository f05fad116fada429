//! The reviewer's page, served from the binary: plain HTML, CSS and JavaScript, no build step.
//! It is public (no token); it asks for the token when the API answers 401. The script is a
//! few classic scripts sharing one scope (`page/app.js` lists them), so each stays readable.

use std::sync::{Arc, LazyLock};

use axum::Router;
use axum::http::header;
use axum::routing::get;

use super::state::AppState;

const INDEX: &str = include_str!("page/index.html");
/// Where the page's status filter takes its options.
const STATUS_OPTIONS: &str =
    "<!-- statuses: one option per store::STATUSES, written by the server (page.rs) -->";

/// The page as served: the status filter offers every status the list takes
/// ([`crate::store::STATUSES`], the one list), not a hand-kept copy of it.
static PAGE: LazyLock<String> = LazyLock::new(|| {
    let options: String = crate::store::STATUSES
        .iter()
        .map(|s| format!("<option value=\"{s}\">{s}</option>\n        "))
        .collect();
    INDEX.replacen(STATUS_OPTIONS, options.trim_end(), 1)
});
const STYLE: &str = include_str!("page/style.css");

/// The page's scripts, by path, in the order `index.html` loads them.
const SCRIPTS: [(&str, &str); 13] = [
    ("/app.js", include_str!("page/app.js")),
    ("/runs.js", include_str!("page/runs.js")),
    ("/calls.js", include_str!("page/calls.js")),
    ("/context.js", include_str!("page/context.js")),
    ("/graph.js", include_str!("page/graph.js")),
    ("/audit.js", include_str!("page/audit.js")),
    ("/fork.js", include_str!("page/fork.js")),
    ("/queue.js", include_str!("page/queue.js")),
    ("/cards.js", include_str!("page/cards.js")),
    ("/preview.js", include_str!("page/preview.js")),
    ("/standing.js", include_str!("page/standing.js")),
    ("/keys.js", include_str!("page/keys.js")),
    ("/start.js", include_str!("page/start.js")),
];

pub(super) fn routes() -> Router<Arc<AppState>> {
    let mut r = Router::new()
        .route(
            "/",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                    PAGE.as_str(),
                )
            }),
        )
        .route(
            "/style.css",
            get(|| async { ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE) }),
        );
    for (path, text) in SCRIPTS {
        r = r.route(
            path,
            get(move || async move {
                (
                    [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
                    text,
                )
            }),
        );
    }
    r
}
