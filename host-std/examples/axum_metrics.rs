//! Prometheus metrics mounted in a runtime's own axum server: no second server, no `http`
//! feature. [`negotiate`] picks the format from `Accept` (`406` when neither is acceptable) and
//! [`render`] encodes the registry at scrape time.
//!
//! `cargo run -p specula --example axum_metrics` serves one scrape of itself and exits; set
//! `SPECULA_EXAMPLE_SERVE=1` to keep serving on 127.0.0.1:9464.

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use specula::http::negotiate;
use specula::prom::{Options, SpecCollector, render};
use specula::prometheus_client::registry::Registry;
use specula::wire_ranks;
use std::io::{Read, Write};
use std::sync::Arc;

/// `GET /metrics`.
async fn metrics(State(registry): State<Arc<Registry>>, headers: HeaderMap) -> Response {
    // Several Accept lines are one list.
    let mut accept = Vec::new();
    for v in headers.get_all(header::ACCEPT) {
        match v.to_str() {
            Ok(v) => accept.push(v),
            Err(_) => return StatusCode::BAD_REQUEST.into_response(),
        }
    }
    let accept = accept.join(",");
    let Some(format) = negotiate((!accept.is_empty()).then_some(accept.as_str())) else {
        return StatusCode::NOT_ACCEPTABLE.into_response();
    };
    match render(&registry, format) {
        Ok(body) => ([(header::CONTENT_TYPE, format.content_type())], body).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let wired = wire_ranks::<4>(2)?;
    let registry = SpecCollector::new(wired.slots.clone(), Options::default()).into_registry();
    let app = Router::new()
        .route("/metrics", get(metrics))
        .with_state(Arc::new(registry));
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
