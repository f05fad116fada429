//! Compacting one Request's context after the provider said it does not fit the model's window
//! (`llm.context_overflow`): a fixed sequence of levels, each dropping more than the one before.
//!
//! - Level 1: the previous step's calls show only their tool, status and output path (no
//!   params, results or errors); large values in state are replaced, oldest write first, by
//!   their state path and size until the state shown is at most half its full size; the input
//!   is shown under the run's usual caps.
//! - Level 2: likewise down to an eighth of the state's full size, and state and input are
//!   shown under much tighter caps (strings cut at 200 characters, arrays at 10 items, 2 KiB in
//!   all, blobs from 64 characters).
//! - Level 3 ([`MAX_LEVEL`]): every large value of state and input is replaced by its path and
//!   size, under caps of 1 KiB, and the workspace memory chunks are left out.
//!
//! Every level ends with a note telling the model the context was shortened and that the full
//! values are still in state, reachable by reference. Pure and deterministic: the same state
//! log and plan give the same messages, so a replay compacts as the run did. Deliberately not
//! here: deciding when to compact or how far (the run machine moves one level per refused
//! answer), and measuring tokens (sizes are characters of JSON).

use std::sync::Arc;

use serde_json::{Value, json};

use super::{PlanEntry, SanitizeLimits};
use crate::protocol::{OutputMethod, Segment};
use crate::state::{Write, apply};

/// The most compacted level; a turn refused at it cannot be compacted further.
pub const MAX_LEVEL: u8 = 3;

/// Values shorter than this (characters of JSON) are never replaced: a marker is about as long.
const MIN_REPLACED_CHARS: usize = 80;

/// The caps state and input are shown under at `level`, `usual` being the run's own.
pub fn limits(level: u8, usual: SanitizeLimits) -> SanitizeLimits {
    let tight = SanitizeLimits {
        blob_min_chars: 64,
        max_string_chars: 200,
        max_array_items: 10,
        max_total_bytes: 2 * 1024,
    };
    match level {
        0 | 1 => usual,
        2 => tight,
        _ => SanitizeLimits {
            max_total_bytes: 1024,
            ..tight
        },
    }
}

/// The share of the state's full size the state shown may keep at `level` (a right shift:
/// 1 = half, 3 = an eighth); `None` when every large value goes.
fn state_shift(level: u8) -> Option<u32> {
    match level {
        0 => Some(0),
        1 => Some(1),
        2 => Some(3),
        _ => None,
    }
}

/// A plan entry as compaction shows it: its tool, status and output path only.
pub fn brief(entry: &PlanEntry) -> PlanEntry {
    let call = entry.call.as_deref().map(|c| {
        let mut brief = crate::protocol::Call::new(c.tool.clone());
        brief.output_path.clone_from(&c.output_path);
        Arc::new(brief)
    });
    PlanEntry {
        id: entry.id,
        call,
        status: entry.status.clone(),
        result: None,
        error: None,
        missing: Vec::new(),
    }
}

/// The state view as shown at `level`: large values replaced, oldest write first, by a marker
/// naming their path and size, until the view is small enough for the level.
pub fn state(view: Value, log: &[Write], level: u8) -> Value {
    let full = chars(&view);
    let budget = state_shift(level).map_or(0, |s| full >> s);
    // The written places, by their last write (oldest first); the goal's initial state (one
    // write of the whole kind) counts as a write of each of its members.
    let mut places: Vec<Vec<Segment>> = Vec::new();
    for w in log.iter().filter(|w| w.path.kind() == "state") {
        let rel = w.path.rest();
        let written: Vec<Vec<Segment>> = match (rel.is_empty(), w.value.as_ref()) {
            (true, Value::Object(m)) => m.keys().map(|k| vec![Segment::Key(k.clone())]).collect(),
            _ => vec![rel.to_vec()],
        };
        for p in written {
            places.retain(|q| *q != p);
            places.push(p);
        }
    }
    replace(view, "state", &places, full, budget)
}

/// The goal's context messages as shown at `level`: from [`MAX_LEVEL`], without the workspace
/// memory message (`super::memory::message`).
pub fn context(messages: &[crate::protocol::Message], level: u8) -> Vec<crate::protocol::Message> {
    messages
        .iter()
        .filter(|m| level < MAX_LEVEL || !super::memory::is_message(m))
        .cloned()
        .collect()
}

/// The input as shown at `level`: from [`MAX_LEVEL`], its large members replaced by a marker.
pub fn input(view: Value, level: u8) -> Value {
    if level < MAX_LEVEL {
        return view;
    }
    let places: Vec<Vec<Segment>> = match &view {
        Value::Object(m) => m.keys().map(|k| vec![Segment::Key(k.clone())]).collect(),
        _ => vec![Vec::new()],
    };
    let full = chars(&view);
    replace(view, "input", &places, full, 0)
}

/// Replaces the values at `places`, in order, by markers until the view is at most `budget`
/// characters (or every large one is replaced).
fn replace(view: Value, kind: &str, places: &[Vec<Segment>], full: usize, budget: usize) -> Value {
    let mut total = full;
    let mut slot = Some(view);
    for rel in places {
        if total <= budget {
            break;
        }
        let Some(v) = slot.as_ref().and_then(|v| apply::get(v, rel)) else {
            continue;
        };
        let size = chars(v);
        if size < MIN_REPLACED_CHARS {
            continue;
        }
        let path = crate::protocol::Path::new(kind, rel.iter().cloned());
        let marker = json!(format!(
            "[not shown: {size} characters at †{path}; refer to it by reference]"
        ));
        total = total.saturating_sub(size).saturating_add(chars(&marker));
        apply::apply_at(&mut slot, rel, OutputMethod::Set, &marker);
    }
    slot.unwrap_or(Value::Null)
}

/// Characters of `v` as JSON.
pub fn chars(v: &Value) -> usize {
    serde_json::to_string(v).map_or(0, |s| s.chars().count())
}

/// The note that closes a compacted context.
pub fn note(level: u8) -> String {
    format!(
        "The context was too long for the model and was shortened (level {level} of \
         {MAX_LEVEL}): earlier calls show only their tool, status and output path, and large \
         values are replaced by their path and size. The full values are still in state; refer \
         to them with references (†state.path) instead of copying them."
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Path;
    use crate::state::State;

    fn log() -> State {
        let mut s = State::new();
        let big = |c: &str| json!(c.repeat(400));
        s.write(
            Path::root("state"),
            json!({"a": big("a"), "b": "small"}),
            OutputMethod::Set,
            None,
            0,
        );
        s.write(
            Path::new("state", [Segment::Key("c".into())]),
            big("c"),
            OutputMethod::Set,
            None,
            1,
        );
        s.write(
            Path::new("state", [Segment::Key("d".into())]),
            big("d"),
            OutputMethod::Set,
            None,
            2,
        );
        s
    }

    #[test]
    fn the_oldest_large_values_go_first_and_each_level_drops_more() {
        let s = log();
        let view = s.view("state").unwrap();
        let one = state(view.clone(), s.log(), 1);
        // Half of ~1,230 characters: `a` and `c` (the oldest) go, `d` stays.
        assert!(
            one["a"]
                .as_str()
                .unwrap()
                .starts_with("[not shown: 402 characters at †state.a")
        );
        assert!(one["c"].as_str().unwrap().starts_with("[not shown"));
        assert_eq!(one["d"], view["d"]);
        assert_eq!(one["b"], "small");
        let three = state(view.clone(), s.log(), MAX_LEVEL);
        assert!(three["d"].as_str().unwrap().starts_with("[not shown"));
        assert_eq!(three["b"], "small", "small values stay");
        assert!(chars(&three) < chars(&one) && chars(&one) < chars(&view));
        // Deterministic.
        assert_eq!(state(view, s.log(), 1), one);
    }

    #[test]
    fn a_plan_entry_keeps_its_tool_status_and_output_path() {
        let e = PlanEntry {
            id: crate::protocol::CallId(3),
            call: crate::protocol::Call::try_from(
                json!({"_tool": "fetch", "url": "x", "_outputPath": "†state.page"}),
            )
            .ok()
            .map(Arc::new),
            status: "failed".into(),
            result: Some(json!("long")),
            error: Some(json!({"code": "activity.failed"})),
            missing: vec!["state.x".into()],
        };
        let b = brief(&e);
        assert_eq!(
            b.call.map(|c| c.to_value()),
            Some(json!({"_tool": "fetch", "_outputPath": "†state.page"}))
        );
        assert_eq!(
            (b.status.as_ref(), b.result, b.error),
            ("failed", None, None)
        );
    }
}
