//! Listing runs from what the store keeps on each run's row: the query a front-end asks
//! (`GET /runs`, `dagloop runs`), the summary it gets back, the cursor of the next page, and
//! the one rule that says what a run's status is (`waiting`, `running`, `stopped`, or how it
//! ended).
//!
//! A run's row holds what listing needs: its title (the goal's first line), who submitted it,
//! how many calls await a decision and its earliest journaled deadline. The driver keeps the
//! last two current as it commits ([`crate::engine::JournalSink::note`]); rows written by an
//! older dagloop have them unknown until a front-end derives them once by replay
//! (`runs::list_runs`).
//!
//! Deliberately not here: SQL (the SQLite store answers the query) or who may see which run
//! (the server says whose runs to list).

use serde::{Deserialize, Serialize};

use crate::machine::RunStatus;
use crate::protocol::Millis;

/// The status of a stored run, derived in this one place (the SQLite store's list query
/// mirrors it in SQL, and a test checks that the two agree): the ending of a finished run;
/// else `waiting` when calls await a decision; else `running` while some process holds its
/// lease; else `stopped` (nobody drives it; it can be resumed).
pub fn derive_status(finished: Option<&str>, awaiting: u64, leased: bool) -> &str {
    match finished {
        Some(s) => s,
        None if awaiting > 0 => "waiting",
        None if leased => "running",
        None => "stopped",
    }
}

/// Whether a run of `status` (as [`derive_status`] says) is listed under `filter` (one of
/// [`STATUSES`]): the status itself, `finished` for any ending, `failed` for any ending but
/// success. The SQLite store's list query says the same in SQL; a list that is not the store's
/// (runs on Temporal) filters with this.
pub fn status_matches(status: &str, filter: &str) -> bool {
    let ended = RunStatus::ENDINGS.iter().any(|e| e.as_str() == status);
    status == filter
        || (filter == "finished" && ended)
        || (filter == "failed" && ended && status != RunStatus::Succeeded.as_str())
}

/// The statuses a run can be listed by: the derived ones, `finished` (any ending), `failed`
/// (any ending but success) and each ending ([`RunStatus::ENDINGS`], so a new ending is
/// listable the day it exists).
pub const STATUSES: [&str; 5 + RunStatus::ENDINGS.len()] = {
    let mut out = [""; 5 + RunStatus::ENDINGS.len()];
    out[0] = "waiting";
    out[1] = "running";
    out[2] = "stopped";
    out[3] = "finished";
    out[4] = "failed";
    let mut i = 0;
    while i < RunStatus::ENDINGS.len() {
        out[5 + i] = RunStatus::ENDINGS[i].as_str();
        i += 1;
    }
    out
};

/// The most runs one page holds, and how many a page holds unless asked.
pub const MAX_LIMIT: usize = 500;
/// How many runs a page holds unless asked.
pub const DEFAULT_LIMIT: usize = 50;

/// The longest title kept (characters): the goal's first line, cut.
pub const TITLE_CHARS: usize = 200;

/// What to list. Runs come waiting first, then newest first (`created_at`, then id, both
/// descending).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunQuery {
    /// Only runs with one of these statuses (see [`STATUSES`]); empty: every run.
    pub statuses: Vec<String>,
    /// Only runs whose id or title contains this text (case-insensitive for ASCII).
    pub text: Option<String>,
    /// Only runs submitted by this principal.
    pub submitted_by: Option<String>,
    /// Only the runs of this session: the run with this id and its follow-ups.
    pub session: Option<String>,
    /// At most this many (capped at [`MAX_LIMIT`]; 0 means [`DEFAULT_LIMIT`]).
    pub limit: usize,
    /// Start after this run (the cursor of the previous page).
    pub after: Option<Cursor>,
}

/// A list request that cannot be answered; each has a stable code.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// A status that no run can have.
    #[error("`{given}` is not a run status (one of: {})", STATUSES.join(", "))]
    BadStatus {
        /// What was given.
        given: String,
    },
    /// A limit that is not a whole number from 1 to [`MAX_LIMIT`].
    #[error("limit must be a whole number from 1 to {MAX_LIMIT}, not `{given}`")]
    BadLimit {
        /// What was given.
        given: String,
    },
    /// A cursor this store did not make.
    #[error("`{given}` is not a cursor from a previous page's Link header")]
    BadCursor {
        /// What was given.
        given: String,
    },
    /// A parameter the list does not take.
    #[error("unknown parameter `{name}` (expected status, q, limit, cursor)")]
    Unknown {
        /// Its name.
        name: String,
    },
}

crate::codes::has_code!(QueryError);

impl QueryError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            QueryError::BadStatus { .. } => "runs.bad_status",
            QueryError::BadLimit { .. } => "runs.bad_limit",
            QueryError::BadCursor { .. } => "runs.bad_cursor",
            QueryError::Unknown { .. } => "runs.bad_param",
        }
    }
}

impl RunQuery {
    /// The query that `status` (one or several, comma-separated, or repeated), `q`, `limit`
    /// and `cursor` ask for: what `GET /runs` and `dagloop runs` take, checked alike.
    pub fn from_params<'a>(
        params: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<RunQuery, QueryError> {
        let mut q = RunQuery::default();
        for (k, v) in params {
            match k {
                "status" => {
                    for s in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                        if !STATUSES.contains(&s) {
                            return Err(QueryError::BadStatus { given: s.into() });
                        }
                        if !q.statuses.iter().any(|x| x == s) {
                            q.statuses.push(s.to_string());
                        }
                    }
                }
                "q" => q.text = Some(v.to_string()).filter(|t| !t.is_empty()),
                "session" => q.session = Some(v.to_string()).filter(|t| !t.is_empty()),
                "limit" => {
                    q.limit = v
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or_else(|| QueryError::BadLimit { given: v.into() })?;
                }
                "cursor" => {
                    q.after = Some(
                        Cursor::decode(v)
                            .ok_or_else(|| QueryError::BadCursor { given: v.into() })?,
                    );
                }
                other => {
                    return Err(QueryError::Unknown { name: other.into() });
                }
            }
        }
        Ok(q)
    }

    /// The query string of the page after `next` (this query's filters and limit), as
    /// `status=...&q=...&limit=...&cursor=...`, percent-encoded.
    pub fn next_params(&self, next: &Cursor) -> String {
        let mut out = Vec::new();
        if !self.statuses.is_empty() {
            out.push(format!("status={}", encode(&self.statuses.join(","))));
        }
        if let Some(t) = &self.text {
            out.push(format!("q={}", encode(t)));
        }
        if let Some(t) = &self.session {
            out.push(format!("session={}", encode(t)));
        }
        if self.limit > 0 {
            out.push(format!("limit={}", self.limit));
        }
        out.push(format!("cursor={}", encode(&next.encode())));
        out.join("&")
    }
}

/// `s` with everything but unreserved URL characters percent-encoded.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One run as listed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct RunSummary {
    /// The run id.
    pub id: String,
    /// See [`derive_status`].
    pub status: String,
    /// The goal's first line.
    pub title: String,
    /// Calls awaiting a decision.
    pub awaiting: u64,
    /// When it was created (milliseconds since the Unix epoch).
    #[cfg_attr(feature = "server", schema(value_type = u64))]
    pub created_at: Millis,
    /// When its journal last grew (or it finished).
    #[cfg_attr(feature = "server", schema(value_type = u64))]
    pub updated_at: Millis,
    /// Journal entries recorded.
    pub entries: u64,
    /// Who submitted it (runs submitted to a server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<String>,
    /// Who drives it, while somebody holds an unexpired lease on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Its earliest journaled deadline, while it has one and has not finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schema(value_type = Option<u64>))]
    pub wake_at: Option<Millis>,
    /// The goal's input in one line (compact JSON, cut at [`INPUT_SUMMARY_CHARS`]): what tells
    /// runs of one goal apart. Absent when the goal has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
}

/// How much of a run's input [`RunSummary::input`] keeps.
pub const INPUT_SUMMARY_CHARS: usize = 120;

/// A run's input (`$.goal.input` of its record, as SQLite's `json_extract` gives it: JSON text
/// for an object or array, the bare value for a scalar) in one line of at most
/// [`INPUT_SUMMARY_CHARS`] characters.
pub fn input_summary(raw: &str) -> String {
    let flat: String = raw
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() > INPUT_SUMMARY_CHARS {
        let cut: String = flat.chars().take(INPUT_SUMMARY_CHARS - 1).collect();
        format!("{cut}…")
    } else {
        flat
    }
}

impl RunSummary {
    /// Where the page after this run starts.
    pub fn cursor(&self) -> Cursor {
        Cursor {
            waiting: self.status == "waiting",
            created_at: self.created_at,
            id: self.id.clone(),
        }
    }
}

/// A page of runs and, when more follow, where the next page starts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunPage {
    /// The runs, in the listing's order.
    pub runs: Vec<RunSummary>,
    /// The cursor of the next page (None on the last one).
    pub next: Option<Cursor>,
}

/// A position in the listing's order: the run a page ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// It was listed among the waiting runs (which come first).
    pub waiting: bool,
    /// Its creation time.
    pub created_at: Millis,
    /// Its id.
    pub id: String,
}

impl Cursor {
    /// The cursor as text: `w` or `o`, the creation time, a dot, the id.
    pub fn encode(&self) -> String {
        format!(
            "{}{}.{}",
            if self.waiting { 'w' } else { 'o' },
            self.created_at,
            self.id
        )
    }

    /// Reads [`Cursor::encode`]'s text; None when it is not one.
    pub fn decode(s: &str) -> Option<Cursor> {
        let waiting = match s.as_bytes().first()? {
            b'w' => true,
            b'o' => false,
            _ => return None,
        };
        let (at, id) = s.get(1..)?.split_once('.')?;
        if id.is_empty() || !at.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(Cursor {
            waiting,
            created_at: at.parse().ok()?,
            id: id.to_string(),
        })
    }
}

/// A run's title: the first non-empty line of its goal's text, trimmed and cut to
/// [`TITLE_CHARS`] characters.
pub fn title_of(goal_text: &str) -> String {
    goal_text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .chars()
        .take(TITLE_CHARS)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every ending a run can have is a status it can be listed by (a hand-kept list once lacked
    /// `context_overflow`): the match below stops compiling when a status is added, and the
    /// ending it names must then be in [`RunStatus::ENDINGS`].
    #[test]
    fn every_ending_is_listable() {
        let ending = |s: RunStatus| match s {
            RunStatus::Stopped => false,
            RunStatus::Succeeded
            | RunStatus::MaxSteps
            | RunStatus::DoomLoop
            | RunStatus::EmptyTurns
            | RunStatus::TokenBudget
            | RunStatus::Timeout
            | RunStatus::Cancelled
            | RunStatus::InvalidOutput
            | RunStatus::ModelError
            | RunStatus::ContextOverflow
            | RunStatus::SetupFailed => true,
        };
        assert!(RunStatus::ENDINGS.iter().all(|s| ending(*s)));
        assert_eq!(
            RunStatus::ENDINGS.len(),
            11,
            "a new ending goes into ENDINGS"
        );
        for s in RunStatus::ENDINGS {
            assert!(STATUSES.contains(&s.as_str()), "{}", s.as_str());
        }
        assert!(STATUSES.contains(&"context_overflow"));
    }

    #[test]
    fn a_cursor_reads_back_and_junk_is_no_cursor() {
        let c = Cursor {
            waiting: true,
            created_at: 17,
            id: "run-a.b-1".into(),
        };
        assert_eq!(Cursor::decode(&c.encode()), Some(c));
        for bad in ["", "x1.a", "w.a", "w1.", "w1a", "wx.a", "o-1.a"] {
            assert_eq!(Cursor::decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn params_are_checked_with_codes_and_the_next_page_keeps_the_filters() {
        let code =
            |p: &[(&str, &str)]| RunQuery::from_params(p.iter().copied()).map_err(|e| e.code());
        assert_eq!(code(&[("status", "sleeping")]), Err("runs.bad_status"));
        assert_eq!(code(&[("limit", "0")]), Err("runs.bad_limit"));
        assert_eq!(code(&[("limit", "501")]), Err("runs.bad_limit"));
        assert_eq!(code(&[("limit", "x")]), Err("runs.bad_limit"));
        assert_eq!(code(&[("cursor", "nope")]), Err("runs.bad_cursor"));
        assert_eq!(code(&[("sort", "id")]), Err("runs.bad_param"));
        let q = RunQuery::from_params([
            ("status", "waiting,stopped"),
            ("q", "a b&c"),
            ("limit", "5"),
        ])
        .expect("query");
        assert_eq!(q.statuses, vec!["waiting", "stopped"]);
        let next = Cursor {
            waiting: false,
            created_at: 9,
            id: "r 1".into(),
        };
        assert_eq!(
            q.next_params(&next),
            "status=waiting%2Cstopped&q=a%20b%26c&limit=5&cursor=o9.r%201"
        );
    }

    #[test]
    fn a_title_is_the_first_line_with_text_cut() {
        assert_eq!(title_of("\n  Sum the files \nthen more"), "Sum the files");
        assert_eq!(title_of(&"é".repeat(500)).chars().count(), TITLE_CHARS);
        assert_eq!(title_of(""), "");
    }
}
