//! Fallback models: an agent's model list, tried in order within a turn.
//!
//! Each model of the list is already wrapped in its own [`Retrying`](super::Retrying). When the
//! current model's attempt fails after its retries, before it delivered any content, with an
//! error another provider could fix ([`LlmError::falls_back`](super::LlmError::falls_back): transport, timeouts, 408, 409,
//! 429 and 5xx answers, transient provider errors), the turn goes to the next model of the list:
//! a [`StreamEvent::Fallback`] says so (the engine journals it) and the request is sent again,
//! unchanged, to that model. Errors of the request itself (a 400, a schema refusal, a missing
//! key) end the turn on the model that gave them.
//!
//! A stream that breaks after its content had started (an error another provider could fix,
//! arriving mid-answer) is not fallen back from at once: the same model is asked once more
//! without streaming ([`Model::stream_whole`]), and a [`StreamEvent::Reask`] says so (the
//! engine journals it). Only when that whole request fails too, before its content, does the
//! turn go to the next model; a second break after content ends the turn.
//!
//! Each turn starts from the model the caller names ([`Fallback::stream_turn`]): the first of
//! the list for a new turn, the one the journal says answered (and whether it was being
//! re-asked without streaming) for a turn asked again after a restart. Deliberately not here:
//! remembering which model answered (the run machine does, from the journal), and which calls
//! of a re-asked answer the run already took (the engine's turn reader skips them).

use std::sync::Arc;

use futures::StreamExt;

use super::{EventStream, Model, Request, StreamEvent};

/// A non-empty list of models tried in order within one turn. See the module docs.
#[derive(Clone)]
pub struct Fallback {
    models: Vec<Arc<dyn Model>>,
}

impl std::fmt::Debug for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fallback")
            .field("models", &self.names())
            .finish()
    }
}

impl Fallback {
    /// The list `first`, then `rest` in order.
    pub fn new(first: Arc<dyn Model>, rest: Vec<Arc<dyn Model>>) -> Fallback {
        let mut models = Vec::with_capacity(rest.len() + 1);
        models.push(first);
        models.extend(rest);
        Fallback { models }
    }

    /// The models, in the order they are tried.
    pub fn models(&self) -> &[Arc<dyn Model>] {
        &self.models
    }

    /// The display names of the models, in order.
    pub fn names(&self) -> Vec<String> {
        self.models.iter().map(|m| m.name()).collect()
    }

    /// The display name of the model at `index` (the last one when `index` is past the end).
    pub fn name_at(&self, index: usize) -> String {
        self.at(index).name()
    }

    fn at(&self, index: usize) -> &Arc<dyn Model> {
        let i = index.min(self.models.len().saturating_sub(1));
        &self.models[i]
    }

    /// Asks `req` of the model at `start` (clamped to the list), falling back to the next ones
    /// as the module docs say.
    pub fn stream_from(&self, req: Arc<Request>, start: usize) -> EventStream {
        self.stream_turn(req, start, false)
    }

    /// Like [`Fallback::stream_from`]; with `whole`, the turn was already being re-asked of
    /// that model without streaming (a journaled [`StreamEvent::Reask`]): it is asked so again,
    /// and is not re-asked a second time.
    pub fn stream_turn(&self, req: Arc<Request>, start: usize, whole: bool) -> EventStream {
        let start = start.min(self.models.len().saturating_sub(1));
        let state = State {
            models: self.models.clone(),
            req,
            index: start,
            current: None,
            content_seen: false,
            finished: false,
            whole,
            reasked: whole,
        };
        futures::stream::unfold(state, |mut s| async move {
            if s.finished {
                return None;
            }
            let stream = match s.current.as_mut() {
                Some(stream) => stream,
                None => {
                    let model = s.models.get(s.index)?.clone();
                    let attempt = if s.whole {
                        model.stream_whole(s.req.clone())
                    } else {
                        model.stream_shared(s.req.clone())
                    };
                    s.current.insert(attempt)
                }
            };
            match stream.next().await {
                None => None,
                Some(Ok(ev)) => {
                    s.content_seen |= ev.is_content();
                    Some((Ok(ev), s))
                }
                Some(Err(e)) if s.content_seen && !s.reasked && e.falls_back() => {
                    let model = s.models[s.index].name();
                    tracing::warn!(
                        model = %model,
                        code = e.code(),
                        error = %e,
                        "the stream broke after its content had started; asking again without streaming"
                    );
                    let ev = StreamEvent::Reask {
                        model,
                        code: e.code().to_string(),
                        error: e.to_string(),
                    };
                    s.reasked = true;
                    s.whole = true;
                    s.content_seen = false;
                    s.current = None;
                    Some((Ok(ev), s))
                }
                Some(Err(e)) => {
                    let next = s.index + 1;
                    if s.content_seen || !e.falls_back() || next >= s.models.len() {
                        s.finished = true;
                        return Some((Err(e), s));
                    }
                    let from_model = s.models[s.index].name();
                    let to_model = s.models[next].name();
                    tracing::warn!(
                        from = %from_model,
                        to = %to_model,
                        code = e.code(),
                        error = %e,
                        "model failed after its retries; falling back to the next model"
                    );
                    let ev = StreamEvent::Fallback {
                        from: from_model,
                        to: to_model,
                        index: next,
                        code: e.code().to_string(),
                        error: e.to_string(),
                    };
                    s.index = next;
                    s.current = None;
                    // The next model is asked as any turn is (streamed).
                    s.whole = false;
                    Some((Ok(ev), s))
                }
            }
        })
        .boxed()
    }
}

struct State {
    models: Vec<Arc<dyn Model>>,
    req: Arc<Request>,
    index: usize,
    current: Option<EventStream>,
    content_seen: bool,
    finished: bool,
    /// The current model is asked without streaming.
    whole: bool,
    /// The turn was re-asked without streaming once already (never twice).
    reasked: bool,
}

impl Model for Fallback {
    fn stream(&self, req: &Request) -> EventStream {
        self.stream_from(Arc::new(req.clone()), 0)
    }

    fn stream_shared(&self, req: Arc<Request>) -> EventStream {
        self.stream_from(req, 0)
    }

    /// The names of the models, comma-separated, in order.
    fn name(&self) -> String {
        self.names().join(",")
    }

    /// Moves the first model on; a caller that knows which model answered which request moves
    /// each one itself (the engine does, from the journal).
    fn resume_after(&self, attempts: usize) {
        self.at(0).resume_after(attempts);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::{LlmError, Script, ScriptedModel};

    fn scripted(turns: serde_json::Value) -> Arc<dyn Model> {
        let text = serde_json::json!({ "turns": turns }).to_string();
        let script = Script::parse(&text, "<inline>").unwrap();
        Arc::new(ScriptedModel::new(script))
    }

    async fn events(s: EventStream) -> (Vec<StreamEvent>, Option<LlmError>) {
        let mut out = Vec::new();
        let mut s = s;
        while let Some(item) = s.next().await {
            match item {
                Ok(ev) => out.push(ev),
                Err(e) => return (out, Some(e)),
            }
        }
        (out, None)
    }

    fn req() -> Request {
        Request {
            messages: Vec::new(),
            schema: serde_json::json!({"type": "object"}),
            tools: Vec::new(),
            settings: crate::llm::Settings::default(),
        }
    }

    fn solution() -> serde_json::Value {
        serde_json::json!({"solution": {"calls": [], "output": {"ok": true}}})
    }

    #[tokio::test]
    async fn a_provider_fault_goes_to_the_next_model() {
        let f = Fallback::new(
            scripted(serde_json::json!([{"error": {"status": 503}}])),
            vec![scripted(serde_json::json!([solution()]))],
        );
        let (evs, err) = events(f.stream(&req())).await;
        assert_eq!(err, None);
        assert!(matches!(
            &evs[0],
            StreamEvent::Fallback { index: 1, code, .. } if code == "llm.http_status"
        ));
        assert!(evs.iter().any(StreamEvent::is_content));
    }

    #[tokio::test]
    async fn a_request_error_does_not_fall_back() {
        let f = Fallback::new(
            scripted(serde_json::json!([{"error": {"status": 400}}])),
            vec![scripted(serde_json::json!([solution()]))],
        );
        let (evs, err) = events(f.stream(&req())).await;
        assert!(evs.is_empty(), "{evs:?}");
        assert!(matches!(
            err,
            Some(LlmError::HttpStatus { status: 400, .. })
        ));
    }

    /// Streams some text then breaks; asked whole, answers 503.
    struct Breaking;

    impl Model for Breaking {
        fn stream(&self, _req: &Request) -> EventStream {
            futures::stream::iter(vec![
                Ok(StreamEvent::TextDelta("{\"calls\": [".into())),
                Err(LlmError::Transport {
                    message: "connection reset".into(),
                }),
            ])
            .boxed()
        }
        fn stream_whole(&self, _req: Arc<Request>) -> EventStream {
            futures::stream::iter(vec![Err(LlmError::HttpStatus {
                status: 503,
                retry_after: None,
                message: "down".into(),
            })])
            .boxed()
        }
        fn name(&self) -> String {
            "breaking".into()
        }
    }

    #[tokio::test]
    async fn a_stream_broken_after_content_is_asked_again_whole_then_falls_back() {
        let f = Fallback::new(
            Arc::new(Breaking),
            vec![scripted(serde_json::json!([solution()]))],
        );
        let (evs, err) = events(f.stream(&req())).await;
        assert_eq!(err, None);
        assert!(matches!(&evs[0], StreamEvent::TextDelta(_)));
        assert!(
            matches!(&evs[1], StreamEvent::Reask { model, code, .. }
                if model == "breaking" && code == "llm.transport"),
            "{evs:?}"
        );
        assert!(
            matches!(&evs[2], StreamEvent::Fallback { index: 1, code, .. } if code == "llm.http_status"),
            "{evs:?}"
        );
        assert!(evs[3..].iter().any(StreamEvent::is_content));
        // Asked whole again after a restart: a second break is not re-asked.
        let only = Fallback::new(Arc::new(Breaking), Vec::new());
        let (evs, err) = events(only.stream_turn(Arc::new(req()), 0, true)).await;
        assert!(evs.is_empty(), "{evs:?}");
        assert!(matches!(
            err,
            Some(LlmError::HttpStatus { status: 503, .. })
        ));
    }

    #[tokio::test]
    async fn the_last_model_s_fault_ends_the_turn() {
        let f = Fallback::new(
            scripted(serde_json::json!([{"error": {"status": 503}}])),
            vec![scripted(serde_json::json!([{"error": {"status": 502}}]))],
        );
        let (evs, err) = events(f.stream(&req())).await;
        assert_eq!(evs.len(), 1);
        assert!(matches!(
            err,
            Some(LlmError::HttpStatus { status: 502, .. })
        ));
    }
}
