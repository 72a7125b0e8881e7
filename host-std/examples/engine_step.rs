//! Specula dropped into a candle engine (issue 31): the engine keeps a verifier, a ticker and a
//! reusable `specula::candle::Step` in its own struct; each decode step hands over its candle
//! tensors (a ragged batch of three requests with k = 3, 2 and 0, bf16 target logits, f32
//! draft probabilities, a temperature and a top-p per request), gets vLLM's `output_token_ids`
//! back as a tensor and appends each request's tokens to that request's own state. The
//! counters reach Prometheus through the runtime's own axum router; at shutdown the final
//! readback publishes everything counted.
//!
//! What Specula asks of the engine: three fields, four lines to open and wire them, the body
//! of `verify_step`, two lines to mount `/metrics` and two at shutdown. The rest is the
//! engine's own logic, or this example checking itself.
//!
//! `cargo run -p specula --example engine_step --features candle,axum`

use axum::Router;
use specula::backend::Backend;
use specula::candle::{Request, Sampling, Step, TargetTensor};
use specula::candle_core::{DType, Device, Tensor};
use specula::prom::{Options, SpecCollector};
use specula::specula_core::verify::{Check, Filter, Method};
use specula::{AnyReadback, Slots, StdClock, Ticker, shutdown, wire_ranks};
use std::error::Error;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

const K: usize = 4; // the longest draft the counters track per position
const V: usize = 8; // the toy model's vocabulary

/// The engine's own request state.
struct Sequence {
    draft: Vec<u32>,
    sampling: Sampling,
    seed: u64,
    offset: u64,
    output: Vec<u32>,
}

/// A candle engine: its requests, plus what Specula needs, owned (no borrow outlives a call).
struct Engine {
    sequences: Vec<Sequence>,
    verifier: Backend<K>,
    ticker: Ticker<AnyReadback<K>, K>,
    step: Step,
}

impl Engine {
    /// One engine, its counters wired to one labelled slot; the slots go to the consumers.
    fn new(sequences: Vec<Sequence>) -> Result<(Self, Slots<K>), Box<dyn Error>> {
        let verifier = Backend::<K>::open(&"cpu".parse()?)?;
        let mut wired = wire_ranks::<K>(1)?;
        let (writer, period) = (wired.writers.remove(0), Duration::from_secs(5));
        let ticker = Ticker::new(verifier.readback()?, writer, period, StdClock::new())?;
        let engine = Engine {
            sequences,
            verifier,
            ticker,
            step: Step::new(),
        };
        Ok((engine, wired.slots))
    }

    /// Verifies one decode step's tensors; returns vLLM's `output_token_ids`.
    fn verify_step(&mut self, logits: &Tensor, draft: &Tensor) -> Result<Tensor, Box<dyn Error>> {
        self.step.clear();
        for s in &self.sequences {
            self.step.push(Request {
                drafts: &s.draft,
                sampling: s.sampling,
                seed: s.seed,
                offset: s.offset,
                draft_rows: true,
            });
        }
        let target = TargetTensor::Logits(logits);
        let (verifier, method) = (&mut self.verifier, Method::Rejection);
        self.step
            .verify(verifier, method, Check::Cheap, target, Some(draft))?;
        for (s, tokens) in self.sequences.iter_mut().zip(self.step.emitted()) {
            s.output.extend_from_slice(tokens);
            s.offset += 1; // the request's random stream moves on
        }
        self.ticker.step(); // once per decode step; never blocks
        Ok(self.step.vllm_tokens(logits.device())?)
    }
}

/// The toy target model: `rows` positions, each with logit 4 at its top id, 1.5 at the next
/// id, 0 elsewhere; bf16, as an engine's model emits them.
fn target_logits(tops: &[usize]) -> Result<Tensor, Box<dyn Error>> {
    let mut v = vec![0f32; tops.len() * V];
    for (row, &top) in v.chunks_mut(V).zip(tops) {
        row[top] = 4.0;
        row[(top + 1) % V] = 1.5;
    }
    Ok(Tensor::from_vec(v, (tops.len(), V), &Device::Cpu)?.to_dtype(DType::BF16)?)
}

/// The drafters' probabilities, one row per draft token: a small model's (peaked) for request
/// 0, an n-gram drafter's (one-hot) for request 1.
fn draft_probs(sequences: &[Sequence]) -> Result<Tensor, Box<dyn Error>> {
    let mut rows = Vec::new();
    for (b, s) in sequences.iter().enumerate() {
        for &id in &s.draft {
            let mut row = [if b == 0 { 0.05f32 } else { 0.0 }; V];
            row[id as usize] = if b == 0 { 0.65 } else { 1.0 };
            rows.extend_from_slice(&row);
        }
    }
    let n = rows.len() / V;
    Ok(Tensor::from_vec(rows, (n, V), &Device::Cpu)?)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let sequence = |draft: Vec<u32>, temperature, top_p, seed| Sequence {
        draft,
        sampling: Sampling {
            temperature,
            filter: Filter::NONE.with_top_p(top_p),
        },
        seed,
        offset: 0,
        output: Vec::new(),
    };
    // k = 3 at T = 0.7 with top-p 0.9; k = 2 greedy (T = 0); k = 0 at T = 1.
    let (mut engine, slots) = Engine::new(vec![
        sequence(vec![1, 2, 3], 0.7, 0.9, 11),
        sequence(vec![4, 5], 0.0, 1.0, 22),
        sequence(vec![], 1.0, 1.0, 33),
    ])?;

    // Prometheus, mounted in the runtime's own axum router.
    let registry = Arc::new(SpecCollector::new(slots, Options::default()).into_registry());
    let app = Router::new().route("/metrics", specula::http::axum::metrics(registry));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let until_stopped = async {
            stopped.await.ok();
        };
        axum::serve(listener, app)
            .with_graceful_shutdown(until_stopped)
            .await
    });

    // One decode step: num_tokens + B = 8 ragged target rows (request b's k_b + 1 rows follow
    // the previous request's), 5 draft rows.
    let logits = target_logits(&[1, 2, 6, 0, 4, 5, 7, 3])?;
    let draft = draft_probs(&engine.sequences)?;
    let output_token_ids = engine.verify_step(&logits, &draft)?;
    let ids = output_token_ids.to_vec2::<i32>()?;
    println!("output_token_ids {ids:?}");
    // Request 0: at T = 0.7 its top id has probability ≈ 0.95 ≥ 0.9, so top-p keeps it alone:
    // drafts 1 and 2 are the top ids (accepted), 3 is not (rejected) and that row's top id, 6,
    // is emitted, whatever the random draws. Request 1 is greedy: 4, 5 and the bonus 7.
    // Request 2 had no draft: one token, sampled at T = 1.
    assert_eq!((&ids[0], &ids[1]), (&vec![1, 2, 6, -1], &vec![4, 5, 7, -1]));
    assert!(ids[2][0] >= 0 && ids[2][1..] == [-1, -1, -1]);
    assert_eq!(engine.sequences[0].output, [1, 2, 6]);
    assert!(engine.sequences.iter().all(|s| s.offset == 1));

    // One scrape, as Prometheus sends it, over a plain TcpStream.
    let response = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
        let mut s = std::net::TcpStream::connect(addr)?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })
    .await??;
    assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
    assert!(response.contains("specula_accepted_tokens_total{engine=\"rank0\"}"));

    // Shutdown: the final readback publishes everything counted, then the server stops.
    let finished = shutdown::finish(&mut engine.ticker, None);
    finished.flushed?;
    let c = finished.totals.counters;
    println!(
        "drafts {}, draft tokens {}, accepted {}",
        c.drafts, c.draft_tokens, c.accepted_tokens
    );
    // Requests 0 and 1 are counted (request 2 had no draft): 5 draft tokens, 4 accepted.
    assert_eq!((c.drafts, c.draft_tokens, c.accepted_tokens), (2, 5, 4));
    stop.send(()).ok();
    server.await??;
    Ok(())
}
