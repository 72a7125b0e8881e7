//! Picks the verification backend from the command line, verifies one decode step and exports
//! the counters: the same code under every feature set.
//!
//! ```sh
//! cargo run -p specula --example pick_backend -- cpu
//! cargo run -p specula --example pick_backend --features cuda -- cuda:0
//! ```
//!
//! Exit codes: 0 verified; 2 a malformed backend name; 3 the backend is not compiled in; 4 it is
//! compiled in but cannot run here (no driver, device or kernel compiler); 1 anything else.

use specula::StdClock;
use specula::backend::{Backend, BackendSpec};
use specula::specula_core::verify::{
    AcceptedOut, Batch, Check, Dims, Drafts, Method, Outputs, Streams, TokensOut, Verifier,
};
use specula::specula_core::{Clock, Collector, Cursor, ErrorKind, Report, SeqSlot, Snapshot};

const K: usize = 4;

fn main() {
    let name = std::env::args().nth(1).unwrap_or_else(|| "cpu".into());
    if let Err((code, message)) = run(&name) {
        eprintln!("pick_backend: {message}");
        std::process::exit(code);
    }
}

fn run(name: &str) -> Result<(), (i32, String)> {
    let fail = |e: specula::BackendError| {
        let code = match e.kind() {
            ErrorKind::NotCompiledIn => 3,
            k if k.is_unavailable() => 4,
            ErrorKind::InvalidInput => 2,
            _ => 1,
        };
        (code, e.to_string())
    };
    let spec: BackendSpec = name.parse().map_err(fail)?;
    let mut backend = Backend::<K>::open(&spec).map_err(fail)?;
    let clock = StdClock::new();
    let mut slot = SeqSlot::new(Snapshot::<K>::ZERO);
    let (writer, reader) = slot.split();
    let readback = backend.readback().map_err(fail)?;
    let mut collector = Collector::new(readback, writer, 1_000_000_000, clock.now_ns())
        .map_err(|e| (1, format!("collector: {e:?}")))?;
    let mut log = Cursor::new(reader);

    // One step, two requests over a 6-token vocabulary, rejection sampling with a one-hot
    // drafter: request 0 drafted [2, 4], request 1 drafted [5].
    let v = 6;
    let rows: [[f32; 6]; 3] = [
        [0.05, 0.05, 0.6, 0.1, 0.1, 0.1],
        [0.1, 0.1, 0.1, 0.1, 0.5, 0.1],
        [0.2, 0.2, 0.2, 0.2, 0.1, 0.1],
    ];
    let target: Vec<f32> = (0..2)
        .flat_map(|_| rows.iter().flatten().copied())
        .collect();
    let batch = Batch::dense(
        Dims { vocab: v, k_max: 2 },
        Drafts {
            k: &[2, 1],
            ids: &[2, 4, 5, 0],
        },
        &target,
        Streams {
            seed: &[1, 2],
            offset: &[0, 0],
        },
    );
    let (mut accepted, mut tokens) = ([0u32; 2], [0u32; 6]);
    let mut out = Outputs::new(AcceptedOut(&mut accepted), TokensOut(&mut tokens));
    backend
        .verify(Method::Rejection, Check::Cheap, &batch, &mut out)
        .map_err(fail)?;
    println!(
        "{} backend: accepted {accepted:?}, tokens {tokens:?}",
        backend.kind()
    );
    collector
        .flush(clock.now_ns())
        .map_err(|e| (1, format!("flush: {e:?}")))?;
    let taken = log
        .take()
        .ok_or((1, "flush published nothing".to_string()))?;
    println!("{}", Report::new(backend.kind().name(), &taken));
    Ok(())
}
