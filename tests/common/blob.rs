//! A service of big JSON bodies streamed as the connection takes them (`/blob?kib=N`), which
//! records how much it sent and whether a body was dropped before its end; and an `http` tool
//! that fetches one. For the tests of the per-run bound on kept tool results (`result_bound`,
//! `temporal_result_bound`).
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde_json::{Value, json};

/// What the blob service sent: bytes handed to the connection, and whether a body was dropped
/// (its connection closed) before its end.
#[derive(Default)]
pub struct Sent {
    pub bytes: AtomicU64,
    pub cut: AtomicBool,
}

/// A body of `n` bytes that records what it handed out, and whether it was dropped unfinished.
struct Blob {
    left: usize,
    sent: Arc<Sent>,
}

impl Drop for Blob {
    fn drop(&mut self) {
        if self.left > 0 {
            self.sent.cut.store(true, Ordering::SeqCst);
        }
    }
}

/// A service answering `/blob?kib=N` with a JSON string of N KiB (`"bbb…"`), streamed in 64 KiB
/// chunks made as the connection takes them (never held whole).
pub async fn blob_service() -> (u16, Arc<Sent>) {
    let sent = Arc::new(Sent::default());
    let seen = sent.clone();
    let app = axum::Router::new().route(
        "/blob",
        axum::routing::get(
            move |q: axum::extract::Query<std::collections::BTreeMap<String, usize>>| {
                let sent = seen.clone();
                async move {
                    let n = q.get("kib").copied().unwrap_or(1) * 1024;
                    let blob = Blob { left: n + 2, sent };
                    let chunks = futures::stream::unfold(blob, move |mut b| async move {
                        if b.left == 0 {
                            return None;
                        }
                        let first = b.left == n + 2;
                        let len = b.left.min(64 * 1024);
                        let mut chunk = vec![b'b'; len];
                        if first {
                            chunk[0] = b'"';
                        }
                        b.left -= len;
                        if b.left == 0 {
                            chunk[len - 1] = b'"';
                        }
                        b.sent.bytes.fetch_add(len as u64, Ordering::SeqCst);
                        Some((Ok::<_, std::io::Error>(chunk), b))
                    });
                    (
                        [("content-type", "application/json")],
                        axum::body::Body::from_stream(chunks),
                    )
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, sent)
}

/// An `http` tool `name` fetching a blob of `kib` KiB from the service on `port`.
pub fn blob_tool(name: &str, port: u16, kib: usize) -> Value {
    json!({"_tool": name, "_activity": "http",
        "_http": {"method": "GET", "url": format!("http://127.0.0.1:{port}/blob?kib={kib}"),
                  "max_bytes": 64 * 1024 * 1024},
        "type": "object", "properties": {}})
}

/// Checks the record a result over the run's bound left (`e`, the call's `error`): the bound,
/// one byte read past what the run could keep, and the hash and head of what was read (`"` and
/// then b's, as the blob service sends). Returns how many bytes were read.
pub fn assert_bound_record(e: &Value, bound: u64) -> u64 {
    assert_eq!(e["code"], "run.result_bound", "{e}");
    let d = &e["details"];
    assert_eq!(d["complete"], false, "{e}");
    assert_eq!(d["bound"], json!(bound));
    let kept = d["kept"].as_u64().expect("kept");
    let read = d["bytes"].as_u64().expect("bytes");
    assert_eq!(
        read,
        bound - kept + 1,
        "one byte past what the run could keep: {e}"
    );
    let mut prefix = vec![b'b'; read as usize];
    prefix[0] = b'"';
    let digest = ring::digest::digest(&ring::digest::SHA256, &prefix);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(d["sha256"], json!(hex), "{e}");
    assert!(
        d["head"]
            .as_str()
            .is_some_and(|h| h.len() == 1024 && h.starts_with("\"bbb")),
        "{e}"
    );
    read
}
