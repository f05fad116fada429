//! Fuzzes the plan parser: arbitrary bytes, fed in two chunks split at a fuzzer-chosen point.
//!
//! Must never panic, and must give the same events and the same end as feeding the bytes whole
//! (the parser's outcome never depends on how the stream is chunked).

#![no_main]

use dagloop::plan::SolutionParser;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, text)) = data.split_first() else {
        return;
    };
    let at = (split as usize * text.len()) / 255;

    let mut whole = SolutionParser::new();
    let mut expected = whole.feed_bytes(text);
    let expected_end = whole.finish().map(|tail| expected.extend(tail));

    let mut parts = SolutionParser::new();
    let mut events = parts.feed_bytes(&text[..at]);
    events.extend(parts.feed_bytes(&text[at..]));
    let end = parts.finish().map(|tail| events.extend(tail));

    assert_eq!(events, expected);
    assert_eq!(end, expected_end);
});
