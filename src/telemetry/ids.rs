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
    let mut k = Vec::with_capacity(key.len() * 8 + 4);
    for n in key {
        k.extend_from_slice(&n.to_le_bytes());
    }
    k.extend_from_slice(&incarnation.to_le_bytes());
    let d = digest(&[b"dagloop.span", run_id.as_bytes(), what.as_bytes(), &k]);
    let mut id = [0u8; 8];
    id.copy_from_slice(&d[..8]);
    if id == [0; 8] {
        id[7] = 1;
    }
    SpanId(id)
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
        assert_eq!(a.to_string().len(), 16);
    }
}
