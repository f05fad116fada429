//! OTLP over gRPC for dagloop's spans: the already-encoded `ExportTraceServiceRequest` goes to
//! the collector's `TraceService/Export` as it is, through tonic with a codec that passes bytes
//! through (plaintext HTTP/2, like the rest of dagloop's gRPC export).
//!
//! Deliberately not here: encoding (`otlp`), batching (`send`), TLS.

use std::time::Duration;

use bytes::{Buf, BufMut};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::{MetadataKey, MetadataValue};

use super::TelemetryError;
use super::send::Sender;

const EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// Bytes in, the answer read and set aside (its partial success is not looked at).
#[derive(Debug, Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = ();
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = ();
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<()>, tonic::Status> {
        let n = src.remaining();
        src.advance(n);
        Ok(Some(()))
    }
}

fn bad(value: &str, reason: &str) -> TelemetryError {
    TelemetryError::BadVariable {
        var: "OTEL_EXPORTER_OTLP_HEADERS",
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

/// Sends to the collector at `endpoint` (connecting when first used), with `headers` as
/// request metadata, on `rt`.
pub(super) fn sender(
    endpoint: &str,
    headers: &[(String, String)],
    timeout: Duration,
    rt: &'static tokio::runtime::Runtime,
) -> Result<Sender, TelemetryError> {
    let mut metadata = tonic::metadata::MetadataMap::new();
    for (n, v) in headers {
        let key = MetadataKey::from_bytes(n.to_ascii_lowercase().as_bytes())
            .map_err(|_| bad(n, "not a valid gRPC metadata name"))?;
        let value = MetadataValue::try_from(v.as_str())
            .map_err(|_| bad(n, "its value is not valid gRPC metadata"))?;
        metadata.insert(key, value);
    }
    let channel = {
        let _in = rt.enter();
        tonic::transport::Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| TelemetryError::BadVariable {
                var: "OTEL_EXPORTER_OTLP_ENDPOINT",
                value: endpoint.to_string(),
                reason: e.to_string(),
            })?
            .timeout(timeout)
            .connect_lazy()
    };
    let grpc = tonic::client::Grpc::new(channel);
    let url = endpoint.to_string();
    Ok(Box::new(move |body| {
        let mut grpc = grpc.clone();
        let mut request = tonic::Request::new(body);
        *request.metadata_mut() = metadata.clone();
        request.set_timeout(timeout);
        let url = &url;
        rt.block_on(async move {
            grpc.ready().await.map_err(|e| format!("{url}: {e}"))?;
            grpc.unary::<_, (), _>(request, PathAndQuery::from_static(EXPORT), Raw)
                .await
                .map(|_| ())
                .map_err(|s| format!("{url}: {:?}: {}", s.code(), s.message()))
        })
    }))
}
