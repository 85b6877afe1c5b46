//! Logging and the process-wide Prometheus recorder.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

/// Installs a `tracing` subscriber writing to stderr, filtered by `RUST_LOG`
/// (default `info,sqlx=warn,lapin=warn`). Safe to call more than once.
pub fn init_tracing() {
    init_tracing_or("info,sqlx=warn,lapin=warn");
}

/// As [`init_tracing`], with `default` as the filter when `RUST_LOG` is unset.
pub fn init_tracing_or(default: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
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
