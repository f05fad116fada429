//! Workspace memory per step in the machine: it asks the engine for each step's chunks
//! (`Action::Recall`) and asks the model only once they are journaled (`RunInput::Recalled`),
//! with the step's query built from what the step before brought; a machine resumed between
//! the two asks again.

use serde_json::json;

use super::tests::{call, machine};
use super::*;
use crate::context::memory::Chunk;

fn recalls(actions: &[Action]) -> Vec<(u32, String)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Recall { step, query, .. } => Some((*step, query.clone())),
            _ => None,
        })
        .collect()
}

fn request_texts(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Request { messages, .. } => Some(serde_json::to_string(messages).ok()?),
            _ => None,
        })
        .collect()
}

fn chunk(source: &str, text: &str) -> Chunk {
    Chunk {
        source: source.into(),
        line: 1,
        text: text.into(),
    }
}

#[test]
fn each_step_is_asked_once_its_chunks_are_journaled() {
    let mut m = machine(json!({}), Policy::auto());
    m.recall_memory(true);
    let mut out = Vec::new();
    m.handle_into(RunInput::Start, 0, &mut out);
    let asked = recalls(&out);
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].0, 1);
    assert!(request_texts(&out).is_empty(), "no request before the chunks");
    // An answer for another step changes nothing.
    out.clear();
    let other = RunInput::Recalled {
        frame: None,
        step: 2,
        chunks: vec![], note: None,
    };
    m.handle_into(other, 1, &mut out);
    assert!(request_texts(&out).is_empty());
    // A restart before the answer: the machine asks again.
    m.handle_into(RunInput::Resumed, 2, &mut out);
    assert_eq!(recalls(&out).len(), 1, "asked again after the restart");
    out.clear();
    let one = RunInput::Recalled {
        frame: None,
        step: 1,
        chunks: vec![chunk("a.md", "alpha notes")],
        note: None,
    };
    m.handle_into(one, 3, &mut out);
    let sent = request_texts(&out);
    assert_eq!(sent.len(), 1);
    assert!(sent[0].contains("[a.md:1]") && sent[0].contains("alpha notes"));

    // Step 1 calls `note`; step 2's query carries what the call wrote.
    out.clear();
    let c = json!({"_tool": "note", "_output": "the telescope points at Saturn"});
    m.handle_into(
        RunInput::Call {
            frame: None,
            call: call(c).into(),
            parsed: Default::default(),
        },
        4,
        &mut out,
    );
    m.handle_into(
        RunInput::StreamClosed {
            frame: None,
            error: None,
            finish_reason: None,
        },
        5,
        &mut out,
    );
    let asked = recalls(&out);
    assert_eq!(asked.len(), 1, "{out:?}");
    assert_eq!(asked[0].0, 2);
    assert!(asked[0].1.starts_with("g\n"), "the goal first: {}", asked[0].1);
    assert!(asked[0].1.contains("Saturn"), "{}", asked[0].1);
    out.clear();
    let two = RunInput::Recalled {
        frame: None,
        step: 2,
        chunks: vec![chunk("b.md", "Saturn notes")],
        note: None,
    };
    m.handle_into(two, 6, &mut out);
    let sent = request_texts(&out);
    assert_eq!(sent.len(), 1);
    assert!(sent[0].contains("[b.md:1]") && !sent[0].contains("[a.md:1]"));
}
