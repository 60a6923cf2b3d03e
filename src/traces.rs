//! Traces: OpenTelemetry spans exported over OTLP/HTTP (protobuf), off unless the standard
//! `OTEL_*` variables name an endpoint.
//!
//! An Execution's life spans several reconciles (queued, its turn, its run), so its spans are
//! not opened and closed around code: the controllers note what happened when (plain data,
//! [`Span`]), and [`emit`] turns the finished tree into OpenTelemetry spans with their recorded
//! times, continuing the trace of the W3C `traceparent` the client put on the object.
//! Calls to briq made inside [`noted`] are noted with their request id, so each becomes a
//! span of its own.

use std::{cell::RefCell, collections::HashMap, sync::OnceLock, time::SystemTime};

use opentelemetry::{
    Context, KeyValue,
    propagation::TextMapPropagator,
    trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _},
};
use opentelemetry_sdk::{
    Resource,
    propagation::TraceContextPropagator,
    trace::{SdkTracer, SdkTracerProvider},
};

/// The annotation the clients (the Python `KubernetesExecutor`, `kubectl briq exec`) set on an
/// Execution: the W3C `traceparent` of the span that asked for it. Tenant input: it only
/// chooses which trace the operator's spans join, and is used only when well-formed.
pub const TRACEPARENT_ANNOTATION: &str = "briq.cloud/traceparent";

const SERVICE_NAME: &str = "briq-operator";

/// Why tracing could not be turned on as configured.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "OTEL_EXPORTER_OTLP_PROTOCOL={0} is not supported: the operator exports traces over \
         http/protobuf"
    )]
    Protocol(String),
    #[error("OTEL_TRACES_EXPORTER={0} is not supported: use otlp or none")]
    Exporter(String),
    #[error("cannot build the OTLP trace exporter: {0}")]
    Build(String),
}

/// Whether the environment asks for traces: an OTLP endpoint is named, and neither
/// `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none` turns them off.
pub fn configured(env: impl Fn(&str) -> Option<String>) -> Result<bool, Error> {
    let set = |name: &str| env(name).filter(|value| !value.trim().is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(false);
    }
    match set("OTEL_TRACES_EXPORTER").map(|v| v.trim().to_ascii_lowercase()) {
        Some(exporter) if exporter == "none" => return Ok(false),
        Some(exporter) if exporter != "otlp" => return Err(Error::Exporter(exporter)),
        _ => {}
    }
    if set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
        && set("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
    {
        return Ok(false);
    }
    let protocol = set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .map(|v| v.trim().to_owned());
    match protocol.as_deref() {
        None | Some("http/protobuf") => Ok(true),
        Some(other) => Err(Error::Protocol(other.to_owned())),
    }
}

static PROVIDER: OnceLock<Option<SdkTracerProvider>> = OnceLock::new();

/// Turns tracing on when the environment configures it (once per process; later calls report
/// what the first did). The exporter, its endpoint, headers and timeout, the batch processor and
/// the sampler read their standard `OTEL_*` variables.
pub fn init() -> Result<bool, Error> {
    if let Some(provider) = PROVIDER.get() {
        return Ok(provider.is_some());
    }
    let provider = if configured(|name| std::env::var(name).ok())? {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
            .map_err(|error| Error::Build(error.to_string()))?;
        let mut resource = Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name(SERVICE_NAME);
        }
        Some(
            SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(resource.build())
                .build(),
        )
    } else {
        None
    };
    let on = provider.is_some();
    let _ = PROVIDER.set(provider);
    if on {
        tracing::info!("exporting traces over OTLP/HTTP");
    }
    Ok(on)
}

/// Exports the spans still buffered (at shutdown).
pub fn flush() {
    if let Some(Some(provider)) = PROVIDER.get()
        && let Err(error) = provider.force_flush()
    {
        tracing::warn!(%error, "could not export the last traces");
    }
}

fn tracer() -> Option<SdkTracer> {
    PROVIDER
        .get()?
        .as_ref()
        .map(|provider| provider.tracer(SERVICE_NAME))
}

/// Whether spans are exported: callers skip noting what nobody will see.
pub fn enabled() -> bool {
    matches!(PROVIDER.get(), Some(Some(_)))
}

/// One span to emit, with its recorded times and its children.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub name: String,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<(&'static str, String)>,
    /// Set when the step failed: the span's status is then Error with this description.
    pub error: Option<String>,
    pub children: Vec<Span>,
}

impl Span {
    pub fn new(name: impl Into<String>, start: SystemTime, end: SystemTime) -> Self {
        Span {
            name: name.into(),
            start,
            end,
            attributes: Vec::new(),
            error: None,
            children: Vec::new(),
        }
    }

    pub fn attribute(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.attributes.push((key, value.into()));
        self
    }

    pub fn child(mut self, child: Span) -> Self {
        self.children.push(child);
        self
    }

    pub fn children(mut self, children: impl IntoIterator<Item = Span>) -> Self {
        self.children.extend(children);
        self
    }

    pub fn failed(mut self, error: Option<String>) -> Self {
        self.error = error;
        self
    }
}

/// The parent a W3C `traceparent` names, when it is well-formed (else a new trace starts).
fn parent(traceparent: Option<&str>) -> Context {
    let Some(value) = traceparent else {
        return Context::new();
    };
    let carrier = HashMap::from([("traceparent".to_owned(), value.trim().to_owned())]);
    let context = TraceContextPropagator::new().extract(&carrier);
    if context.span().span_context().is_valid() {
        context
    } else {
        Context::new()
    }
}

/// Exports `root` and its children, as a child of `traceparent` when that is well-formed.
pub fn emit(traceparent: Option<&str>, root: &Span) {
    if let Some(tracer) = tracer() {
        emit_under(&tracer, &parent(traceparent), root);
    }
}

fn emit_under(tracer: &SdkTracer, parent: &Context, span: &Span) {
    let attributes = span
        .attributes
        .iter()
        .map(|(key, value)| KeyValue::new(*key, value.clone()))
        .collect::<Vec<_>>();
    let mut started = tracer
        .span_builder(span.name.clone())
        .with_kind(SpanKind::Internal)
        .with_start_time(span.start)
        .with_attributes(attributes)
        .start_with_context(tracer, parent);
    if let Some(error) = &span.error {
        started.set_status(Status::error(error.clone()));
    }
    let context = parent.with_span(started);
    for child in &span.children {
        emit_under(tracer, &context, child);
    }
    context.span().end_with_timestamp(span.end);
}

/// A call to briq, as noted by the client.
#[derive(Debug, Clone, PartialEq)]
pub struct BriqCall {
    /// The MCP tool called (`briq_exec`), or `initialize`, `initialized`, `tools/list`.
    pub operation: String,
    pub start: SystemTime,
    pub end: SystemTime,
    pub request_id: Option<String>,
    /// The HTTP status, when an answer came.
    pub status: Option<u16>,
}

impl BriqCall {
    /// The call as a span (named `briq <operation>`), its request id an attribute.
    pub fn span(&self) -> Span {
        let mut span = Span::new(format!("briq {}", self.operation), self.start, self.end);
        if let Some(id) = &self.request_id {
            span = span.attribute("briq.request_id", id.clone());
        }
        match self.status {
            Some(status) => {
                span = span.attribute("http.response.status_code", status.to_string());
                if status >= 400 {
                    span = span.failed(Some(format!("briq answered {status}")));
                }
            }
            None => span = span.failed(Some("no answer from briq".to_owned())),
        }
        span
    }
}

/// A step's times, and the briq calls made in it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Noted {
    pub start: Option<SystemTime>,
    pub end: Option<SystemTime>,
    pub calls: Vec<BriqCall>,
}

impl Noted {
    pub fn between(start: SystemTime, end: SystemTime) -> Self {
        Noted {
            start: Some(start),
            end: Some(end),
            calls: Vec::new(),
        }
    }

    pub fn with_calls(mut self, calls: Vec<BriqCall>) -> Self {
        self.calls = calls;
        self
    }

    /// The step as a span named `name`, its briq calls below it; `None` when it was not noted.
    pub fn span(&self, name: &str) -> Option<Span> {
        Some(
            Span::new(name, self.start?, self.end?).children(self.calls.iter().map(BriqCall::span)),
        )
    }
}

tokio::task_local! {
    static CALLS: RefCell<Vec<BriqCall>>;
}

/// Runs `future` as one step of a trace: its start and end, and the briq calls made in it (in
/// this task).
pub async fn noted<F: Future>(future: F) -> (F::Output, Noted) {
    let start = SystemTime::now();
    let (output, calls) = recording(future).await;
    (
        output,
        Noted::between(start, SystemTime::now()).with_calls(calls),
    )
}

/// Runs `future`, noting the briq calls made in it (in this task).
async fn recording<F: Future>(future: F) -> (F::Output, Vec<BriqCall>) {
    CALLS
        .scope(RefCell::new(Vec::new()), async {
            let output = future.await;
            (output, CALLS.with(|calls| calls.take()))
        })
        .await
}

/// Notes a briq call, when inside [`noted`] (else nothing: tracing is off or the caller
/// does not trace).
pub(crate) fn note(call: BriqCall) {
    let _ = CALLS.try_with(|calls| calls.borrow_mut().push(call));
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| vars.get(name).cloned()
    }

    #[test]
    fn traces_are_on_only_when_an_otlp_http_endpoint_is_configured() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        let traces_endpoint = (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://collector:4318/v1/traces",
        );
        type Vars<'a> = &'a [(&'a str, &'a str)];
        let cases: &[(Vars, Result<bool, &str>)] = &[
            (&[], Ok(false)),
            (&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")], Ok(false)),
            (&[endpoint], Ok(true)),
            (&[traces_endpoint], Ok(true)),
            (&[endpoint, ("OTEL_SDK_DISABLED", "true")], Ok(false)),
            (&[endpoint, ("OTEL_SDK_DISABLED", "false")], Ok(true)),
            (&[endpoint, ("OTEL_TRACES_EXPORTER", "none")], Ok(false)),
            (&[endpoint, ("OTEL_TRACES_EXPORTER", "otlp")], Ok(true)),
            (&[("OTEL_TRACES_EXPORTER", "otlp")], Ok(false)),
            (
                &[endpoint, ("OTEL_TRACES_EXPORTER", "zipkin")],
                Err("OTEL_TRACES_EXPORTER=zipkin is not supported: use otlp or none"),
            ),
            (
                &[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")],
                Ok(true),
            ),
            (
                &[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
                Err(
                    "OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported: the operator exports \
                     traces over http/protobuf",
                ),
            ),
            (
                &[
                    endpoint,
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
                ],
                Ok(true),
            ),
        ];
        for (vars, expected) in cases {
            let got = configured(env(vars)).map_err(|e| e.to_string());
            assert_eq!(got, expected.map_err(str::to_owned), "{vars:?}");
        }
    }

    #[test]
    fn a_malformed_or_forged_traceparent_starts_a_new_trace_instead() {
        let valid = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        assert!(parent(Some(valid)).span().span_context().is_valid());
        assert_eq!(
            parent(Some(valid))
                .span()
                .span_context()
                .trace_id()
                .to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        for bad in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01-extra\nx",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ] {
            assert!(
                !parent(Some(bad)).span().span_context().is_valid(),
                "{bad:?} was taken as a parent"
            );
        }
    }

    #[test]
    fn a_briq_call_becomes_a_span_named_by_its_route_with_its_request_id() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let end = start + Duration::from_millis(30);
        let call = |status, request_id: Option<&str>| BriqCall {
            operation: "briq_exec".to_owned(),
            start,
            end,
            request_id: request_id.map(str::to_owned),
            status,
        };
        let name = "briq briq_exec";
        assert_eq!(
            call(Some(200), Some("req-1")).span(),
            Span::new(name, start, end)
                .attribute("briq.request_id", "req-1")
                .attribute("http.response.status_code", "200")
        );
        assert_eq!(
            call(Some(503), Some("req-2")).span(),
            Span::new(name, start, end)
                .attribute("briq.request_id", "req-2")
                .attribute("http.response.status_code", "503")
                .failed(Some("briq answered 503".to_owned()))
        );
        assert_eq!(
            call(None, None).span(),
            Span::new(name, start, end).failed(Some("no answer from briq".to_owned()))
        );
    }

    #[tokio::test]
    async fn calls_are_noted_only_inside_a_recording() {
        let call = BriqCall {
            operation: "briq_status".to_owned(),
            start: SystemTime::UNIX_EPOCH,
            end: SystemTime::UNIX_EPOCH,
            request_id: None,
            status: Some(200),
        };
        note(call.clone());
        let ((), calls) = recording(async { note(call.clone()) }).await;
        assert_eq!(calls, vec![call]);
    }
}
