//! `specula bench`: verification throughput over a grid, as a table or JSON.

use crate::demo::MAX_K;
use crate::ngram::SplitMix64;
use crate::{CliError, MethodArg, backend_kind};
use specula::BackendKind;
use specula::OutputBuffers;
use specula::specula_core::verify::{Batch, Check, Dims, Drafts, Method, Streams, Verifier};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Verification backend.
    #[arg(long, value_parser = backend_kind(), default_value = "cpu")]
    backend: BackendKind,
    /// Batch sizes (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 8, 64])]
    batch: Vec<usize>,
    /// Draft lengths (comma separated, 1..=8).
    #[arg(short, long, value_delimiter = ',', default_values_t = [4usize, 8])]
    k: Vec<usize>,
    /// Vocabulary sizes (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1024usize, 32000])]
    vocab: Vec<usize>,
    /// Methods (comma separated; default all).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [MethodArg::Rejection, MethodArg::Greedy, MethodArg::Typical])]
    method: Vec<MethodArg>,
    /// Seconds spent timing each cell (at least one batch each).
    #[arg(long, default_value_t = 0.2)]
    seconds: f64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// CPU threads for the CPU backend (0 = all).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// GPU ordinal for `--backend cuda` / `--backend rocm` (0..=1023).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=crate::MAX_DEVICE as i64))]
    device: u16,
}

struct Row {
    method: MethodArg,
    batch: usize,
    k: usize,
    vocab: usize,
    iters: u64,
    us_per_batch: f64,
    requests_per_s: f64,
    acceptance: f64,
}

fn method_name(m: MethodArg) -> &'static str {
    match m {
        MethodArg::Rejection => "rejection",
        MethodArg::Greedy => "greedy",
        MethodArg::Typical => "typical",
    }
}

/// Random normalised rows, peaked so acceptance is neither 0 nor 1.
fn fill(rows: &mut [f32], v: usize, rng: &mut SplitMix64) {
    for row in rows.chunks_exact_mut(v) {
        let mut s = 0.0;
        for x in row.iter_mut() {
            let u = rng.next_f64() as f32;
            *x = u * u * u * u;
            s += *x;
        }
        row.iter_mut().for_each(|x| *x /= s);
    }
}

fn cell<V>(
    verifier: &mut V,
    method: MethodArg,
    b: usize,
    k: usize,
    v: usize,
    budget: Duration,
) -> Result<Row, CliError>
where
    V: Verifier<MAX_K>,
    V::Error: std::fmt::Display,
{
    let mut rng = SplitMix64::new(0xBE7C ^ (b * 131 + k * 17 + v) as u64);
    let mut draft_probs = vec![0f32; b * k * v];
    let mut target_probs = vec![0f32; b * (k + 1) * v];
    fill(&mut draft_probs, v, &mut rng);
    fill(&mut target_probs, v, &mut rng);
    let draft_ids: Vec<u32> = draft_probs
        .chunks_exact(v)
        .map(|row| crate::ngram::sample(row, &mut rng))
        .collect();
    let ks = vec![k as u32; b];
    let seeds: Vec<u64> = (0..b as u64).collect();
    let mut offsets = vec![0u64; b];
    let mut out = OutputBuffers::new();
    let m: Method = method.into();
    let before = verifier
        .totals()
        .map_err(|e| CliError::Run(format!("reading the counters failed: {e}")))?;
    let start = Instant::now();
    let mut iters = 0u64;
    while iters == 0 || start.elapsed() < budget {
        let batch = Batch::dense(
            Dims { vocab: v, k_max: k },
            Drafts {
                k: &ks,
                ids: &draft_ids,
            },
            &target_probs,
            Streams {
                seed: &seeds,
                offset: &offsets,
            },
        )
        .with_draft_probs(&draft_probs);
        verifier
            .verify(m, Check::Cheap, &batch, &mut out.fit(&batch))
            .map_err(|e| CliError::Run(format!("verification failed: {e}")))?;
        offsets.iter_mut().for_each(|o| *o += 1);
        iters += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let after = verifier
        .totals()
        .map_err(|e| CliError::Run(format!("reading the counters failed: {e}")))?;
    let d = after.delta_since(&before);
    Ok(Row {
        method,
        batch: b,
        k,
        vocab: v,
        iters,
        us_per_batch: secs * 1e6 / iters as f64,
        requests_per_s: (iters * b as u64) as f64 / secs,
        acceptance: d.acceptance_rate().unwrap_or(0.0),
    })
}

fn grid<V>(v: &mut V, a: &BenchArgs) -> Result<Vec<Row>, CliError>
where
    V: Verifier<MAX_K>,
    V::Error: std::fmt::Display,
{
    let budget = Duration::try_from_secs_f64(a.seconds)
        .map_err(|_| CliError::Usage("--seconds must be a non-negative number".into()))?;
    let mut rows = Vec::new();
    for &method in &a.method {
        for &b in &a.batch {
            for &k in &a.k {
                for &vocab in &a.vocab {
                    rows.push(cell(v, method, b, k, vocab, budget)?);
                }
            }
        }
    }
    Ok(rows)
}

/// The most probability data one bench cell may allocate (1 GiB): draft and target rows,
/// `batch × (2k + 1) × vocab` f32 values.
pub const MAX_CELL_BYTES: u64 = 1 << 30;

/// The most values one grid list (`--batch`, `--k`, `--vocab`, `--method`) may hold.
pub const MAX_LIST: usize = 64;

/// The most cells one grid may have (the product of the four lists' lengths).
pub const MAX_CELLS: usize = 4096;

/// The most seconds of timing one grid may ask for (cells × `--seconds`).
pub const MAX_GRID_SECONDS: f64 = 3600.0;

/// The most probability data one grid may fill, all cells together (16 GiB: each cell fills
/// its rows with random numbers before it is timed, whatever `--seconds` says).
pub const MAX_GRID_BYTES: u64 = 16 << 30;

/// The bytes of probabilities a cell allocates, `None` on overflow.
fn cell_bytes(b: usize, k: usize, v: usize) -> Option<u64> {
    (b as u64)
        .checked_mul(2 * k as u64 + 1)?
        .checked_mul(v as u64)?
        .checked_mul(4)
}

/// Checks every size the user controls before anything is allocated.
fn check(a: &BenchArgs) -> Result<(), CliError> {
    for (name, len) in [
        ("batch", a.batch.len()),
        ("k", a.k.len()),
        ("vocab", a.vocab.len()),
        ("method", a.method.len()),
    ] {
        if len > MAX_LIST {
            return Err(CliError::Usage(format!(
                "--{name} lists {len} values; at most {MAX_LIST}"
            )));
        }
    }
    if a.batch.iter().any(|&b| b == 0 || b > 4096) {
        return Err(CliError::Usage("--batch values must be 1..=4096".into()));
    }
    if a.k.iter().any(|&k| k == 0 || k > MAX_K) {
        return Err(CliError::Usage(format!("--k values must be 1..={MAX_K}")));
    }
    if a.vocab.iter().any(|&v| v == 0 || v > 1 << 20) {
        return Err(CliError::Usage("--vocab values must be 1..=1048576".into()));
    }
    if !(0.0..=600.0).contains(&a.seconds) {
        return Err(CliError::Usage(
            "--seconds must be 0..=600 seconds per cell".into(),
        ));
    }
    // At most MAX_LIST⁴ cells, each list already capped: the products cannot overflow.
    let cells = a.method.len() * a.batch.len() * a.k.len() * a.vocab.len();
    if cells > MAX_CELLS {
        return Err(CliError::Usage(format!(
            "--method × --batch × --k × --vocab is {cells} cells; at most {MAX_CELLS}"
        )));
    }
    if cells as f64 * a.seconds > MAX_GRID_SECONDS {
        return Err(CliError::Usage(format!(
            "{cells} cells × --seconds {} is {:.0} s of timing; at most {MAX_GRID_SECONDS} s",
            a.seconds,
            cells as f64 * a.seconds
        )));
    }
    // At most MAX_CELLS / |methods| shapes here (the checks above bound the loop).
    let mut grid_bytes = 0u64;
    for &b in &a.batch {
        for &k in &a.k {
            for &v in &a.vocab {
                let bytes = cell_bytes(b, k, v).unwrap_or(u64::MAX);
                grid_bytes = grid_bytes.saturating_add(bytes.saturating_mul(a.method.len() as u64));
                if bytes > MAX_CELL_BYTES {
                    return Err(CliError::Usage(format!(
                        "--batch {b} --k {k} --vocab {v} needs {:.1} GB of probabilities \
                         (batch × (2k + 1) × vocab × 4 bytes); at most {:.1} GB per cell",
                        bytes as f64 / 1e9,
                        MAX_CELL_BYTES as f64 / 1e9
                    )));
                }
            }
        }
    }
    if grid_bytes > MAX_GRID_BYTES {
        return Err(CliError::Usage(format!(
            "the grid fills {:.1} GB of probabilities in all; at most {:.1} GB",
            grid_bytes as f64 / 1e9,
            MAX_GRID_BYTES as f64 / 1e9
        )));
    }
    Ok(())
}

pub fn run(a: BenchArgs) -> Result<(), CliError> {
    check(&a)?;
    let rows = grid(
        &mut crate::open_backend(a.backend, a.threads, a.device)?,
        &a,
    )?;
    use std::io::Write as _;
    let mut out = crate::stdio::stdout();
    // A closed pipe or descriptor, or a full disk, is exit 5, never a panic.
    let failed = |e: std::io::Error| CliError::Output(format!("cannot write to stdout: {e}"));
    let backend = a.backend.name();
    if a.json {
        let items: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{{\"backend\":\"{backend}\",\"method\":\"{}\",\"batch\":{},\"k\":{},\"vocab\":{},\"iterations\":{},\"us_per_batch\":{:.3},\"requests_per_s\":{:.1},\"acceptance_rate\":{:.4}}}",
                    method_name(r.method), r.batch, r.k, r.vocab, r.iters, r.us_per_batch, r.requests_per_s, r.acceptance
                )
            })
            .collect();
        writeln!(out, "[{}]", items.join(",\n ")).map_err(failed)?;
    } else {
        writeln!(
            out,
            "{:<9} {:<10} {:>6} {:>3} {:>7} {:>8} {:>13} {:>14} {:>10}",
            "backend",
            "method",
            "batch",
            "k",
            "vocab",
            "iters",
            "µs/batch",
            "requests/s",
            "accepted"
        )
        .map_err(failed)?;
        for r in &rows {
            writeln!(
                out,
                "{:<9} {:<10} {:>6} {:>3} {:>7} {:>8} {:>13.1} {:>14.0} {:>9.1}%",
                backend,
                method_name(r.method),
                r.batch,
                r.k,
                r.vocab,
                r.iters,
                r.us_per_batch,
                r.requests_per_s,
                r.acceptance * 100.0
            )
            .map_err(failed)?;
        }
    }
    out.flush().map_err(failed)?;
    Ok(())
}
