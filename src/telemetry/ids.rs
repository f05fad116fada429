//! Trace and span ids derived from the run id, so that every process that drives a run (the
//! first, a resume after a crash, a server that adopts it) writes into the same trace and can
//! name the spans of earlier processes without having stored them.
//!
//! Deliberately not here: whether a trace is sampled or exported (the pipeline decides).

/// A 16-byte OpenTelemetry trace id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TraceId(pub [u8; 16]);

/// An 8-byte OpenTelemetry span id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SpanId(pub [u8; 8]);

impl std::fmt::Display for TraceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl std::fmt::Display for SpanId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

fn digest(parts: &[&[u8]]) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for p in parts {
        ctx.update(&(p.len() as u64).to_le_bytes());
        ctx.update(p);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// The trace of a run: the same in every process that drives it.
pub fn trace_id(run_id: &str) -> TraceId {
    let d = digest(&[b"dagloop.trace", run_id.as_bytes()]);
    let mut id = [0u8; 16];
    id.copy_from_slice(&d[..16]);
    // An all-zero id is invalid in OpenTelemetry; SHA-256 makes it practically impossible, but
    // the rule is cheap to keep.
    if id == [0; 16] {
        id[15] = 1;
    }
    TraceId(id)
}

/// The span id of one thing in a run: `what` names the kind (`run`, `call`, `step`...), `key`
/// the instance, `incarnation` the process that drove it (0 for the first, n after the n-th
/// resume).
pub fn span_id(run_id: &str, what: &str, key: &[u64], incarnation: u32) -> SpanId {
    SpanKeys::new(run_id).span_id(what, key, incarnation)
}

/// The span ids of one run. A run names a span per call, step and turn, so the run's key is
/// taken once (SHA-256 of its id) and each id is then a keyed mix of the kind, the instance
/// and the incarnation: a few dozen instructions where a digest per span cost thousands
/// (callgrind: 5,400 instructions per call on the driver's thread, a third of tracing's cost).
/// Ids are only names, never secrets: they must be the same in every process and distinct
/// within a trace, which a bijective 64-bit mixer keyed by the run gives.
#[derive(Debug, Clone, Copy)]
pub struct SpanKeys {
    k0: u64,
    k1: u64,
}

/// splitmix64's finalizer: a bijection on u64 that spreads every input bit over the output.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl SpanKeys {
    /// The keys of `run_id`'s span ids.
    pub fn new(run_id: &str) -> Self {
        let d = digest(&[b"dagloop.span", run_id.as_bytes()]);
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&d[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        SpanKeys {
            k0: word(0),
            k1: word(1),
        }
    }

    /// See [`span_id`].
    pub fn span_id(&self, what: &str, key: &[u64], incarnation: u32) -> SpanId {
        // FNV-1a over the kind's few bytes, then each part mixed in with its position's key.
        let mut h = what.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        h = mix(h ^ self.k0);
        h = mix(h.wrapping_add(key.len() as u64));
        for n in key {
            h = mix(h ^ n).wrapping_add(self.k1);
        }
        h = mix(h ^ u64::from(incarnation) ^ self.k1.rotate_left(32));
        let id = h.to_be_bytes();
        SpanId(if id == [0; 8] {
            [0, 0, 0, 0, 0, 0, 0, 1]
        } else {
            id
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_distinct() {
        assert_eq!(trace_id("run-1"), trace_id("run-1"));
        assert_ne!(trace_id("run-1"), trace_id("run-2"));
        assert_eq!(trace_id("run-1").to_string().len(), 32);
        let a = span_id("run-1", "call", &[3], 0);
        assert_eq!(a, span_id("run-1", "call", &[3], 0));
        assert_ne!(a, span_id("run-1", "call", &[3], 1));
        assert_ne!(a, span_id("run-1", "step", &[3], 0));
        assert_ne!(a, span_id("run-2", "call", &[3], 0));
        assert_ne!(a, span_id("run-1", "call", &[3, 0], 0));
        assert_eq!(a, SpanKeys::new("run-1").span_id("call", &[3], 0));
        assert_eq!(a.to_string().len(), 16);
    }

    #[test]
    fn a_large_runs_span_ids_do_not_collide() {
        let keys = SpanKeys::new("run-big");
        let mut seen = std::collections::BTreeSet::new();
        for what in ["call", "approval", "step", "turn"] {
            for n in 0..50_000u64 {
                for incarnation in 0..2 {
                    assert!(seen.insert(keys.span_id(what, &[n], incarnation)));
                }
            }
        }
        for (a, b) in [(0u64, 1u64), (1, 0), (7, 7)] {
            assert!(seen.insert(keys.span_id("frame", &[a, b], 0)));
        }
    }
}
