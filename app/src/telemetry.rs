//! Logging and the process-wide Prometheus recorder.
//!
//! A healthy service logs nothing at ERROR: an event the service expects and
//! recovers from is logged at WARN (or lower) with a message that says so.
//! The library reports that break this rule — lapin's ERRORs for a
//! connection the broker closed on shutdown (`CONNECTION_FORCED`) or reset —
//! are left out here, and [`crate::backends::AmqpHandle`] logs the lost
//! connection itself, at WARN. So are lapin's ERRORs once the service closes
//! its own AMQP connections at shutdown ([`amqp_closing`]): channels still
//! closing then report the connection's end as an error.

use std::fmt::Write as _;
use std::io::IsTerminal as _;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// Installs a `tracing` subscriber writing to stderr, filtered by `RUST_LOG`
/// (default `info,sqlx=warn,lapin=warn`). Safe to call more than once.
pub fn init_tracing() {
    init_tracing_or("info,sqlx=warn,lapin=warn");
}

/// As [`init_tracing`], with `default` as the filter when `RUST_LOG` is unset.
pub fn init_tracing_or(default: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::registry()
        .with(LostAmqpConnection)
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                // Colours on a terminal only, not in log files.
                .with_ansi(std::io::stderr().is_terminal()),
        )
        .try_init();
}

/// Set once the service closes its AMQP connections at shutdown.
static AMQP_CLOSING: AtomicBool = AtomicBool::new(false);

/// Tells the log filter that the service is closing its AMQP connections on
/// purpose (shutdown): from then on lapin's ERROR reports, which its
/// channels make of that close, are left out.
pub fn amqp_closing() {
    AMQP_CLOSING.store(true, Ordering::SeqCst);
}

/// Leaves out lapin's ERROR reports of a connection lost the way a broker
/// restart loses it: the broker's `Connection.Close` with reply code 320
/// (`CONNECTION_FORCED`: it is shutting down) and the reset or closed socket
/// that goes with it, and the connection error lapin reports for either.
/// The AMQP handle logs the loss at WARN and reconnects on the next use;
/// every other report (another close code, a protocol error) stays an ERROR.
struct LostAmqpConnection;

impl<S: Subscriber> Layer<S> for LostAmqpConnection {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if !meta.target().starts_with("lapin") || *meta.level() != Level::ERROR {
            return true;
        }
        if AMQP_CLOSING.load(Ordering::SeqCst) {
            return false;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        !is_lost_connection_report(&fields.message, &fields.method, &fields.error)
    }
}

/// The `message`, `method` and `error` fields of an event, as text.
#[derive(Default)]
struct Fields {
    message: String,
    method: String,
    error: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => write!(self.message, "{value:?}"),
            "method" => write!(self.method, "{value:?}"),
            "error" => write!(self.error, "{value:?}"),
            _ => Ok(()),
        }
        .expect("writing to a String cannot fail");
    }
}

/// Whether a lapin ERROR event with these fields (in lapin's `Debug` form)
/// reports a connection lost to a broker restart: the close the broker sends
/// when it shuts down, or the socket it resets or closes.
fn is_lost_connection_report(message: &str, method: &str, error: &str) -> bool {
    match message {
        "Connection closed" => method.contains("reply_code: 320"),
        "error doing IO" => ["ConnectionReset", "ConnectionAborted", "BrokenPipe", "UnexpectedEof"]
            .iter()
            .any(|kind| error.contains(&format!("kind: {kind}"))),
        // The same two causes, as lapin's `Display` of the connection error.
        "Connection error" => {
            let error = error.to_ascii_lowercase();
            ["connection-forced", "connection reset", "connection aborted", "broken pipe"]
                .iter()
                .any(|cause| error.contains(cause))
        }
        // The socket the broker closed, seen before its close frame.
        _ => message.starts_with("Socket was readable but we read 0."),
    }
}

/// Latency buckets in seconds, 0.5 ms to 10 s.
const LATENCY_BUCKETS_S: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// The process-wide Prometheus recorder, installed on first call. The HTTP
/// layer (axum-prometheus) and the strategies record into it through the
/// `metrics` macros; `GET /metrics` renders it.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Suffix("duration_seconds".to_owned()),
                    LATENCY_BUCKETS_S,
                )
                .expect("static buckets are valid")
                .install_recorder()
                .expect("the Prometheus recorder is installed once per process")
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::is_lost_connection_report;

    // The fields as lapin 4.12 logs them on a broker restart and on a
    // broker's internal error.
    const FORCED: &str = r#"Close { reply_code: 320, reply_text: ShortString("CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"), class_id: 0, method_id: 0 }"#;
    const INTERNAL: &str = r#"Close { reply_code: 541, reply_text: ShortString("INTERNAL_ERROR"), class_id: 0, method_id: 0 }"#;
    const RESET: &str = r#"Error { kind: IOError(Os { code: 104, kind: ConnectionReset, message: "Connection reset by peer" }), notifier: None }"#;
    const PARSE: &str = r#"Error { kind: ParsingError(..), notifier: None }"#;

    #[test]
    fn a_broker_restart_is_left_out_of_lapins_errors() {
        assert!(is_lost_connection_report("Connection closed", FORCED, ""));
        assert!(is_lost_connection_report("error doing IO", "", RESET));
        let half_closed = "Socket was readable but we read 0. This usually means that the \
                           connection is half closed, thus report it as broken.";
        assert!(is_lost_connection_report(half_closed, "", ""));
        let forced = "protocol error: AMQP hard error: CONNECTION-FORCED: CONNECTION_FORCED - \
                      broker forced connection closure with reason 'shutdown'";
        assert!(is_lost_connection_report("Connection error", "", forced));
        let reset = "IO error: Connection reset by peer (os error 104)";
        assert!(is_lost_connection_report("Connection error", "", reset));
    }

    #[test]
    fn other_closes_and_io_errors_stay_errors() {
        assert!(!is_lost_connection_report("Connection closed", INTERNAL, ""));
        assert!(!is_lost_connection_report("Channel closed", FORCED, ""));
        assert!(!is_lost_connection_report("Connection closed", "", ""));
        assert!(!is_lost_connection_report("error doing IO", "", PARSE));
        assert!(!is_lost_connection_report("parse error", "", RESET));
        let internal = "protocol error: AMQP hard error: INTERNAL-ERROR: INTERNAL_ERROR";
        assert!(!is_lost_connection_report("Connection error", "", internal));
    }
}
