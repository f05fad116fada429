//! What the run machine does when a model turn cannot be answered as asked: a context the
//! provider refuses as longer than the model's window is compacted one level further and the
//! turn asked again, until the most compacted level is refused too (`run.context_overflow`);
//! a stream that broke after its content had started is re-asked without streaming (the
//! provider layer decides that; the machine records it).
//!
//! Both follow from journaled inputs (the stream's end with its error, the re-ask), so a replay
//! or a resume does the same. Deliberately not here: what each compaction level drops
//! (`context::compact`), and recognising the provider's answers (`llm`).

use serde_json::{Value, json};

use super::{Action, FrameKey, RunError, RunMachine};
use crate::context::compact::MAX_LEVEL;
use crate::context::fit::Window;
use crate::protocol::{EventKind, Millis};

impl RunMachine {
    /// Publishes why the current turn starts over (`kind`), then its new first request.
    pub(super) fn turn_restarted(
        &mut self,
        frame: FrameKey,
        kind: EventKind,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        self.emit(frame, None, kind, now, out);
        self.emit(
            frame,
            None,
            EventKind::RequestStarted { attempt: 1 },
            now,
            out,
        );
    }

    /// A turn the provider refused because its context does not fit the window
    /// (`llm.context_overflow`), before anything of it arrived, is asked again of the same
    /// model with its context compacted one level further ([`super::Frame::compacted_messages`]);
    /// true when it was. At the most compacted level the error becomes `run.context_overflow`,
    /// naming the size of each refused context, and the agent ends with it.
    pub(super) fn compact(
        &mut self,
        frame: FrameKey,
        error: &mut RunError,
        now: Millis,
        out: &mut Vec<Action>,
    ) -> bool {
        let cause = error.cause.as_ref();
        let text = |k: &str| cause.and_then(|c| c.get(k)).and_then(Value::as_str);
        if text("code") != Some("llm.context_overflow") {
            return false;
        }
        let refused = cause
            .and_then(|c| c.get("request_chars"))
            .and_then(Value::as_u64);
        let (keep, usual) = (self.keep_launched, self.sanitize);
        let Some(f) = self.frames.get_mut(&frame) else {
            return false;
        };
        if !f.streaming || f.turn.calls > 0 || !f.turn.output.is_null() {
            return false;
        }
        f.turn.refused.extend(refused);
        // The window the refusal names, if it does (kept for the run's later turns).
        let window = text("message")
            .and_then(|m| Window::from_refusal(m, refused.unwrap_or(0)))
            .or(self.window);
        let give_up = |f: &super::frame::Frame, smallest: Option<(u64, u64)>| {
            let sizes: Vec<String> = f.turn.refused.iter().map(u64::to_string).collect();
            let sizes = if sizes.is_empty() {
                "unknown".to_string()
            } else {
                sizes.join(", ")
            };
            let (how, fit) = match (smallest, window) {
                (Some((chars, tokens)), Some(w)) => (
                    format!(
                        "even its most compacted form ({chars} characters, about {tokens} \
                         tokens) is longer than the model's window of {} tokens",
                        w.tokens
                    ),
                    json!({"window_tokens": w.tokens, "smallest_chars": chars,
                           "smallest_tokens": tokens}),
                ),
                _ => (format!("even compacted {MAX_LEVEL} times"), json!({})),
            };
            let mut e = RunError::new(
                "run.context_overflow",
                format!(
                    "the context did not fit the model's window: {how} (contexts refused, in \
                     characters: {sizes}): {}",
                    text("message").unwrap_or("the provider said the context is too long"),
                ),
            );
            let mut cause = json!({
                "code": "llm.context_overflow",
                "message": text("message"),
                "refused_chars": f.turn.refused,
                "levels": MAX_LEVEL,
            });
            if let (Some(c), Value::Object(extra)) = (cause.as_object_mut(), fit) {
                c.extend(extra);
            }
            e.cause = Some(cause);
            e
        };
        if f.turn.compaction >= MAX_LEVEL {
            *error = give_up(f, None);
            return false;
        }
        // Without a known window, one level further; with one, the least level that fits.
        let (level, messages, chars) = match window {
            Some(w) => {
                let (level, messages, chars) =
                    f.fitting_level(f.turn.compaction + 1, &w, usual);
                if w.exceeded_by(chars) {
                    *error = give_up(f, Some((chars, w.tokens_of(chars))));
                    return false;
                }
                (level, messages, chars)
            }
            None => {
                let level = f.turn.compaction + 1;
                let messages = f.compacted_messages(level, usual);
                let chars = crate::llm::wire::json_chars(&messages) as u64;
                (level, messages, chars)
            }
        };
        f.turn.compaction = level;
        f.turn.attempt = 1;
        if keep {
            f.messages.clone_from(&messages);
        }
        let (step, config, model, whole) = (f.step, f.cfg.clone(), f.turn.model, f.turn.whole);
        let kind = EventKind::ContextCompacted {
            chars,
            level,
            refused_chars: refused,
        };
        self.window = window;
        self.turn_restarted(frame, kind, now, out);
        out.push(Action::Request {
            frame,
            step,
            messages,
            config,
            skip_calls: 0,
            model,
            whole,
        });
        true
    }

    /// The model's stream broke after its content had started and the turn is asked again of
    /// the same model without streaming: the turn's output so far is dropped (the whole answer
    /// gives it again), the calls already taken are kept (the engine skips the answer's first
    /// ones in their place), and a resumed run asks the turn the same way.
    pub(super) fn reask(
        &mut self,
        frame: FrameKey,
        model: String,
        code: String,
        error: String,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        let Some(f) = self.frames.get_mut(&frame).filter(|f| f.streaming) else {
            return;
        };
        f.turn.whole = true;
        f.turn.attempt = 1;
        f.turn.output = Value::Null;
        let calls_kept = f.turn.calls as u64;
        let kind = EventKind::StreamReasked {
            model,
            code,
            error,
            calls_kept,
        };
        self.turn_restarted(frame, kind, now, out);
    }
}
