//! Prometheus metrics mounted in a runtime's own axum server: no second server, no `http`
//! feature; the `axum` feature's route negotiates the format from `Accept` (`406` when neither
//! is acceptable) and encodes the registry at scrape time. A server other than axum calls
//! `specula::http::scrape` the same way.
//!
//! `cargo run -p specula --example axum_metrics --features axum` serves one scrape of itself and exits; set
//! `SPECULA_EXAMPLE_SERVE=1` to keep serving on 127.0.0.1:9464.

use axum::Router;
use specula::http::axum::metrics;
use specula::prom::{Options, SpecCollector};
use specula::wire_ranks;
use std::io::{Read, Write};
use std::sync::Arc;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let wired = wire_ranks::<4>(2)?;
    let registry = SpecCollector::new(wired.slots.clone(), Options::default()).into_registry();
    let app = Router::new()
        // One line: the route with its registry (any router state).
        .route("/metrics", metrics(Arc::new(registry)));
    if std::env::var_os("SPECULA_EXAMPLE_SERVE").is_some() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:9464").await?;
        println!("serving http://127.0.0.1:9464/metrics");
        return Ok(axum::serve(listener, app).await?);
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    // One scrape, as Prometheus sends it.
    let response = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
        let mut s = std::net::TcpStream::connect(addr)?;
        s.write_all(
            b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
              Accept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n\r\n",
        )?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })
    .await??;
    server.abort();
    print!("{response}");
    assert!(response.starts_with("HTTP/1.1 200 OK"));
    assert!(response.contains("application/openmetrics-text"));
    Ok(())
}
