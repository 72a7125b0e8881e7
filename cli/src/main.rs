//! The `specula` command: `specula demo` and `specula bench`.

use crate::demo::{DemoConfig, MAX_K};
use crate::ngram::MAX_ORDER;
use clap::{Parser, Subcommand, ValueEnum};
use specula::log_sink::{LineLogger, MIN_PERIOD};
use specula::shutdown::{Reason, Shutdown};
use specula::specula_core::ErrorKind;
use specula::specula_core::verify::{Filter, Method};
use specula::{BackendError, BackendKind, BackendSpec};
use std::io::{IsTerminal, Write as _};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

mod bench;
mod demo;
mod ngram;
mod stdio;
mod step;
mod tree_demo;

/// Exit codes, shown by `--help` (keep in step with [`CliError::code`] and docs/PROGRAM.md).
///
/// A demo stopped by SIGINT or SIGTERM exits 0, not 130/143: the stop was asked for and the
/// shutdown completed (counters flushed, final log line, summary and FINAL line printed), so a
/// supervisor must not record a failure (systemd counts exit 143 as failed unless told
/// otherwise; Kubernetes reports it as an error); the summary says which signal stopped it.
const EXIT_CODES: &str = "\
Exit codes:
  0  success, including a demo stopped by SIGINT or SIGTERM: it stops stepping, flushes the
     counters, logs the final line, prints the summary and the FINAL line, keeps serving
     /metrics for --linger (a second signal ends that, or skips it if it came first) and exits
     0; a third signal exits at once with 128 + its number (130 for SIGINT, 143 for SIGTERM),
     flushed or not. Every signal counts, however close together
  1  the run failed (includes a --metrics-addr already in use, a GPU backend failing after start,
     a failed final readback or a panicked log thread: the summary is printed first)
  2  bad arguments or input (an unreadable --corpus, an out-of-range setting, an interval under
     1 ms, a --label or --model-name that is not a valid Prometheus label), refused before any
     work is done
  3  the requested backend is not compiled in (rebuild with `--features cuda` / `--features rocm`)
  4  the backend is compiled in but cannot run here: no GPU driver or runtime, no device (or not
     the --device asked for), or no runtime kernel compiler (NVRTC / hiprtc)
  5  output failed: stdout or stderr could not be written (a closed pipe, a stream closed at
     start with >&- or 2>&-, a full disk), --help and --version included; the demo stops as on a
     signal, flushes the counters and reports the totals on the stream that still works";

/// Speculative-decoding verification: demo and benchmark.
#[derive(Parser, Debug)]
#[command(name = "specula", version, about, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a real speculative-decoding loop: an n-gram draft model proposes, an n-gram target
    /// model scores, the verifier decides; logs, /metrics and a final summary.
    #[command(after_help = EXIT_CODES)]
    Demo(DemoArgs),
    /// Time verification over a grid of batch sizes, draft lengths and vocabularies.
    #[command(after_help = EXIT_CODES)]
    Bench(bench::BenchArgs),
}

/// `--backend`: the library's [`BackendKind`] by its name (what [`BackendSpec`] parses), so
/// the program names backends exactly as `Backend::open` does, with a help line for each.
fn backend_kind() -> impl clap::builder::TypedValueParser<Value = BackendKind> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser as _};
    let help = |k: BackendKind| match k {
        BackendKind::Cpu => "The CPU backend".to_owned(),
        BackendKind::Reference => {
            "The core's plain-loop reference (slow, the bit-exact definition)".to_owned()
        }
        BackendKind::Cuda => "NVIDIA GPUs (build with `--features cuda`)".to_owned(),
        BackendKind::Rocm => "AMD GPUs (build with `--features rocm`)".to_owned(),
        k => k.to_string(),
    };
    PossibleValuesParser::new(BackendKind::ALL.map(|k| PossibleValue::new(k.name()).help(help(k))))
        .map(|name| {
            BackendKind::ALL
                .into_iter()
                .find(|k| k.name() == name)
                .expect("one of the possible values")
        })
}

/// Verification method names on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MethodArg {
    /// Lossless rejection sampling.
    Rejection,
    /// Greedy (argmax match).
    Greedy,
    /// Typical acceptance.
    Typical,
}

impl From<MethodArg> for Method {
    fn from(m: MethodArg) -> Self {
        match m {
            MethodArg::Rejection => Method::Rejection,
            MethodArg::Greedy => Method::Greedy,
            MethodArg::Typical => Method::Typical,
        }
    }
}

#[derive(clap::Args, Debug)]
struct DemoArgs {
    /// Verification backend.
    #[arg(long, value_parser = backend_kind(), default_value = "cpu")]
    backend: BackendKind,
    /// Draft tokens per step.
    #[arg(short, long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..=MAX_K as i64))]
    k: u8,
    /// Verification method.
    #[arg(long, value_enum, default_value_t = MethodArg::Rejection)]
    method: MethodArg,
    /// Random seed (prompts, draft sampling, verifier streams).
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
    /// Requests verified together.
    #[arg(short, long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=4096))]
    batch: u16,
    /// Stop after this many emitted tokens.
    #[arg(long)]
    tokens: Option<u64>,
    /// Stop after this many seconds (default 10 when no --tokens).
    #[arg(long)]
    duration: Option<f64>,
    /// Seconds between log lines.
    #[arg(long, default_value_t = 5.0)]
    log_interval: f64,
    /// Seconds between counter collections.
    #[arg(long, default_value_t = 0.1)]
    collect_interval: f64,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9464).
    #[arg(long)]
    metrics_addr: Option<SocketAddr>,
    /// Run as a small vLLM engine for vLLM's dashboards and log parsers: also export the
    /// vllm:spec_decode_* names (v1 and v0), vllm:num_requests_running,
    /// vllm:generation_tokens_total and vllm:inter_token_latency_seconds with engine="0", and
    /// log vLLM's exact "SpecDecoding metrics: " line.
    #[arg(long)]
    vllm_compat: bool,
    /// The model_name label on every series (vLLM's served model name).
    #[arg(long, default_value = demo::DEFAULT_MODEL_NAME)]
    model_name: String,
    /// Another constant label on every series, NAME=VALUE (repeatable). NAME follows
    /// Prometheus' rules ([a-zA-Z_][a-zA-Z0-9_]*, no leading "__") and may not be engine,
    /// position, le, quantile, job, instance, version, max_draft, length, draft_length, window
    /// or model_name; VALUE is 1 to 256 bytes without control characters. A bad label exits 2.
    #[arg(long = "label", value_name = "NAME=VALUE")]
    labels: Vec<String>,
    /// Keep serving /metrics this many seconds after the run ends.
    #[arg(long, default_value_t = 0.0)]
    linger: f64,
    /// Train on this text file instead of the bundled corpus.
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// Target model order (3 = trigram; 1..=5).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=MAX_ORDER as i64))]
    target_order: u8,
    /// Draft model order (2 = bigram; 1..=5).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=MAX_ORDER as i64))]
    draft_order: u8,
    /// CPU threads for the CPU backend (0 = all).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// GPU ordinal for `--backend cuda` / `--backend rocm` (0..=1023).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=MAX_DEVICE as i64))]
    device: u16,
    /// Hand the target rows to the verifier as logits with this temperature (0 = greedy);
    /// without it, as probabilities. CPU and reference backends.
    #[arg(long)]
    temperature: Option<f32>,
    /// Per-request top-k of the sampled requests (0 = off). CPU and reference backends.
    #[arg(long, default_value_t = 0)]
    top_k: u32,
    /// Per-request top-p, in (0, 1] (1 = off). CPU and reference backends.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Per-request min-p, in [0, 1] (0 = off). CPU and reference backends.
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Make the first N requests of the batch greedy (temperature 0, argmax drafts) while the
    /// others sample: greedy and sampled requests in one batch (logits; at most --batch).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=4096))]
    greedy_requests: u16,
    /// Draft the full WIDTH-ary token tree of depth DEPTH on the n-gram draft model instead of
    /// a k-token chain (top-WIDTH continuations for greedy, WIDTH sampled ones verified by
    /// SpecInfer's rule for rejection; at most 64 draft nodes, depth at most 8), verified by
    /// the backend's tree verifier in the live loop: the tree counts go through the log line,
    /// /metrics and the summary like the chain counts.
    #[arg(long, value_name = "WIDTHxDEPTH")]
    tree: Option<crate::tree_demo::TreeShape>,
    /// With --tree, instead of the live demo: run the tree and a chain of the same node budget
    /// (k = the tree's draft nodes) from the same prompts for --steps steps each and print their
    /// mean accepted lengths (depth up to 64).
    #[arg(long, requires = "tree")]
    compare: bool,
    /// Steps of each run with --tree --compare (at most 1 000 000, and steps × batch × tree
    /// nodes at most 2^28).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    steps: u32,
    /// A request finishes after emitting this many tokens and a new prompt takes its place (its
    /// acceptance rate goes into the finished-request histogram); 0 = requests never finish.
    #[arg(long, default_value_t = 512)]
    request_tokens: u64,
    /// Log the native line's detailed form: acceptance-length distribution, conditional
    /// acceptance per position and the draft-length advice, per interval and lifetime.
    #[arg(long)]
    log_detail: bool,
    /// Seconds of the sliding window of the window="recent" gauges on /metrics (conditional
    /// acceptance, advice).
    #[arg(long, default_value_t = 60.0)]
    advice_window: f64,
    /// Instead of one run: a calibration run at k = 8 (its advice predicts every k from that
    /// single run), then the demo at every k = 1..8 (--sweep-rounds rounds, interleaved, each
    /// run --duration seconds, default 3), printing measured tokens/s next to the prediction;
    /// exits 1 when the advised k's measured throughput is more than 5 % below the best.
    #[arg(long, conflicts_with_all = ["tree", "metrics_addr", "vllm_compat"])]
    sweep_k: bool,
    /// Rounds of the k = 1..8 runs with --sweep-k (the median of each k is compared).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=demo::MAX_SWEEP_ROUNDS as i64))]
    sweep_rounds: u32,
}

/// Errors the command reports; each maps to an exit code (see [`EXIT_CODES`]).
#[derive(Debug)]
pub enum CliError {
    /// Bad arguments or input (exit 2).
    Usage(String),
    /// The backend is not compiled into this binary (exit 3).
    Backend(String),
    /// The backend is compiled in but has no driver, runtime, device or kernel compiler here
    /// (exit 4).
    Unavailable(String),
    /// The run failed (exit 1).
    Run(String),
    /// stdout or stderr could not be written (exit 5).
    Output(String),
}

impl CliError {
    fn code(&self) -> u8 {
        match self {
            Self::Run(_) => 1,
            Self::Usage(_) => 2,
            Self::Backend(_) => 3,
            Self::Unavailable(_) => 4,
            Self::Output(_) => 5,
        }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Usage(m)
            | Self::Backend(m)
            | Self::Unavailable(m)
            | Self::Run(m)
            | Self::Output(m) => f.write_str(m),
        }
    }
}

fn seconds(name: &str, s: f64) -> Result<Duration, CliError> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| CliError::Usage(format!("--{name} must be a non-negative number of seconds")))
}

/// A period: at least [`MIN_PERIOD`] (1 ms; shorter ones only spin a core and flood the log).
fn period(name: &str, s: f64) -> Result<Duration, CliError> {
    let d = seconds(name, s)?;
    if d < MIN_PERIOD {
        return Err(CliError::Usage(format!(
            "--{name} must be at least {} s (1 ms), got {s} s",
            MIN_PERIOD.as_secs_f64()
        )));
    }
    Ok(d)
}

/// SIGINT and SIGTERM received so far, counted in the signal handler itself.
#[cfg(unix)]
static SIGNALS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// The numbers of the first two signals received (0 until then).
#[cfg(unix)]
static SIGNAL_NUMBERS: [std::sync::atomic::AtomicI32; 2] = [
    std::sync::atomic::AtomicI32::new(0),
    std::sync::atomic::AtomicI32::new(0),
];

/// The SIGINT / SIGTERM handler's own work: count the signal, remember the first two numbers,
/// and on the third exit at once with 128 + its number. Only lock-free atomics and `_exit`:
/// async-signal-safe.
#[cfg(unix)]
fn on_signal(sig: i32) {
    use std::sync::atomic::Ordering;
    let n = SIGNALS.fetch_add(1, Ordering::SeqCst);
    if let Some(slot) = SIGNAL_NUMBERS.get(n) {
        slot.store(sig, Ordering::SeqCst);
    } else {
        signal_hook::low_level::exit(128 + sig);
    }
}

/// Forwards SIGINT and SIGTERM to `shutdown`. From here on these signals no longer kill the
/// process: the first stops the demo (it flushes and reports), the second ends `--linger`,
/// and a third exits at once with 128 + the signal number (130, 143), in case the shutdown
/// itself is stuck (a GPU readback that never completes).
///
/// Every signal counts, however close together: the handler counts it in an atomic (and
/// exits on the third itself, whatever the other threads are doing), then writes a byte to a
/// socket that wakes the forwarding thread, which requests one shutdown per signal counted.
/// signal-hook's iterator is not used: it reports which signals arrived since it last looked,
/// so two SIGTERMs a millisecond apart were one.
#[cfg(unix)]
fn forward_signals(shutdown: &Shutdown) -> Result<(), CliError> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    use std::io::Read as _;
    use std::sync::atomic::Ordering;
    let failed = |e: std::io::Error| {
        CliError::Run(format!("cannot install the SIGINT/SIGTERM handler: {e}"))
    };
    let (mut wake, waker) = std::os::unix::net::UnixStream::pair().map_err(failed)?;
    for sig in [SIGINT, SIGTERM] {
        // SAFETY: the action runs inside the signal handler; `on_signal` only does atomic
        // operations on lock-free statics and may call `_exit`, all async-signal-safe (no
        // allocation, no lock, no panic: `128 + sig` cannot overflow for a signal number).
        unsafe { signal_hook::low_level::register(sig, move || on_signal(sig)) }.map_err(failed)?;
        // Registered after the count (signal-hook runs a signal's actions in the order they
        // were registered), so a woken thread always sees the count of the signal that woke it.
        signal_hook::low_level::pipe::register(sig, waker.try_clone().map_err(failed)?)
            .map_err(failed)?;
    }
    let asker = shutdown.clone();
    std::thread::Builder::new()
        .name("specula-signals".into())
        .spawn(move || {
            let (mut forwarded, mut bytes) = (0usize, [0u8; 64]);
            loop {
                match wake.read(&mut bytes) {
                    Ok(0) => return,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => return,
                }
                let counted = SIGNALS.load(Ordering::SeqCst).min(SIGNAL_NUMBERS.len());
                for slot in &SIGNAL_NUMBERS[forwarded..counted] {
                    asker.request(Reason::Signal(slot.load(Ordering::SeqCst)));
                }
                forwarded = forwarded.max(counted);
            }
        })
        .map_err(|e| CliError::Run(format!("cannot start the signal thread: {e}")))?;
    Ok(())
}

/// No signal forwarding off Unix: Ctrl-C ends the process as before.
#[cfg(not(unix))]
fn forward_signals(_: &Shutdown) -> Result<(), CliError> {
    Ok(())
}

/// The largest `--corpus` read (32 MiB): training keeps a few hash-map entries per character,
/// so this bounds the demo's memory and start-up time as well as the read.
pub const MAX_CORPUS_BYTES: u64 = 32 << 20;

/// Reads a `--corpus` file: a regular file of at most [`MAX_CORPUS_BYTES`], in one pass into one
/// buffer sized from the file's length (memory: its size plus one page of slack, never a
/// doubling), decoded in place. FIFOs, sockets, devices (`/dev/zero`) and directories are
/// refused before they are opened for reading, so nothing blocks or reads without end; a file
/// that grows while read is cut off at the cap plus one byte and refused.
fn read_corpus(path: &std::path::Path) -> Result<String, CliError> {
    use std::io::Read as _;
    let shown = path.display();
    let usage = |what: String| CliError::Usage(format!("cannot read corpus {shown}: {what}"));
    let meta = std::fs::metadata(path).map_err(|e| usage(e.to_string()))?;
    if !meta.is_file() {
        return Err(usage(
            "not a regular file (FIFOs, sockets, devices and directories are refused)".into(),
        ));
    }
    let too_big = |n: u64| {
        usage(format!(
            "{n} bytes is more than the {MAX_CORPUS_BYTES} bytes ({} MiB) allowed",
            MAX_CORPUS_BYTES >> 20
        ))
    };
    if meta.len() > MAX_CORPUS_BYTES {
        return Err(too_big(meta.len()));
    }
    let file = std::fs::File::open(path).map_err(|e| usage(e.to_string()))?;
    // The same file as the one checked (a path swapped in between is caught here).
    let meta = file.metadata().map_err(|e| usage(e.to_string()))?;
    if !meta.is_file() {
        return Err(usage("not a regular file".into()));
    }
    // `meta.len() <= MAX_CORPUS_BYTES`, which fits a usize on every supported target.
    let len = usize::try_from(meta.len()).unwrap_or(0);
    let mut bytes = Vec::with_capacity(len + 1);
    file.take(MAX_CORPUS_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| usage(e.to_string()))?;
    if bytes.len() as u64 > MAX_CORPUS_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| usage(format!("not UTF-8 text: {e}")))
}

/// The most `--label` flags: each is checked against the others (a duplicate is refused), so
/// their number is bounded like every other figure a user gives.
pub const MAX_LABELS: usize = 32;

/// `--label NAME=VALUE` arguments as pairs (validated with the model name by
/// [`demo::const_labels`]).
fn parse_labels(args: &[String]) -> Result<Vec<(String, String)>, CliError> {
    if args.len() > MAX_LABELS {
        return Err(CliError::Usage(format!(
            "bad label: {} --label flags; at most {MAX_LABELS}",
            args.len()
        )));
    }
    args.iter()
        .map(|a| {
            a.split_once('=')
                .map(|(n, v)| (n.to_owned(), v.to_owned()))
                .ok_or_else(|| {
                    CliError::Usage(format!("bad label: --label {a:?} is not NAME=VALUE"))
                })
        })
        .collect()
}

/// `specula demo --tree WIDTHxDEPTH --compare`: the tree-versus-chain comparison, printed to
/// stdout. Every setting is checked before the corpus is read.
fn run_tree_demo(a: &DemoArgs, shape: crate::tree_demo::TreeShape) -> Result<(), CliError> {
    let cfg = crate::tree_demo::TreeDemoConfig {
        shape,
        method: a.method.into(),
        seed: a.seed,
        batch: a.batch.into(),
        steps: a.steps as usize,
        target_order: a.target_order.into(),
        draft_order: a.draft_order.into(),
        threads: a.threads,
    };
    cfg.check().map_err(|e| CliError::Usage(e.to_string()))?;
    check_threads(a.threads)?;
    let corpus = match &a.corpus {
        Some(p) => read_corpus(p)?,
        None => demo::CORPUS.to_owned(),
    };
    let report = crate::tree_demo::compare(&corpus, &cfg).map_err(|e| match e {
        demo::DemoError::Config(_) | demo::DemoError::Corpus(_) => CliError::Usage(e.to_string()),
        _ => CliError::Run(e.to_string()),
    })?;
    let mut out = stdio::stdout();
    writeln!(out, "{report}")
        .and_then(|()| out.flush())
        .map_err(|e| CliError::Output(format!("cannot write the report to stdout: {e}")))
}

/// The demo's settings from the command line, every one checked (exit 2) before any work:
/// nothing is read, trained, opened or started before this returns.
fn demo_config(a: &DemoArgs, shutdown: &Shutdown) -> Result<DemoConfig, CliError> {
    let duration = match (a.duration, a.tokens) {
        (Some(d), _) => Some(seconds("duration", d)?),
        (None, None) => Some(Duration::from_secs(10)),
        (None, Some(_)) => None,
    };
    let cfg = DemoConfig {
        k: a.k.into(),
        method: a.method.into(),
        seed: a.seed,
        batch: a.batch.into(),
        max_tokens: a.tokens,
        duration,
        log_interval: period("log-interval", a.log_interval)?,
        collect_interval: period("collect-interval", a.collect_interval)?,
        metrics_addr: a.metrics_addr,
        vllm_compat: a.vllm_compat,
        model_name: a.model_name.clone(),
        labels: parse_labels(&a.labels)?,
        linger: seconds("linger", a.linger)?,
        target_order: a.target_order.into(),
        draft_order: a.draft_order.into(),
        label: "rank0".into(),
        progress: std::io::stderr().is_terminal(),
        shutdown: shutdown.clone(),
        sampling: demo::Sampling {
            temperature: a.temperature,
            filter: Filter::NONE
                .with_top_k(a.top_k)
                .with_top_p(a.top_p)
                .with_min_p(a.min_p),
            greedy_requests: a.greedy_requests.into(),
        },
        tree: a.tree,
        request_tokens: a.request_tokens,
        log_detail: a.log_detail,
        advice_window: period("advice-window", a.advice_window)?,
    };
    cfg.check().map_err(|e| match e {
        demo::DemoError::ConstLabel(e) => CliError::Usage(format!("bad label: {e}")),
        e => CliError::Usage(e.to_string()),
    })?;
    if a.backend == BackendKind::Cpu {
        check_threads(a.threads)?;
    }
    Ok(cfg)
}

fn run_demo(a: DemoArgs, logger: &LineLogger) -> Result<(), CliError> {
    if let (Some(shape), true) = (a.tree, a.compare) {
        return run_tree_demo(&a, shape);
    }

    let shutdown = Shutdown::new();
    let cfg = demo_config(&a, &shutdown)?;
    logger.request_on_failure(shutdown.clone());
    forward_signals(&shutdown)?;
    let corpus = match &a.corpus {
        Some(p) => read_corpus(p)?,
        None => demo::CORPUS.to_owned(),
    };
    let k = cfg.draft_len();
    let mut stderr = stdio::stderr();
    // Printed before any --linger, so scripts can read the totals while /metrics still serves.
    // A failed write is kept (and ends the linger), never a panic.
    let mut stdout_error: Option<std::io::Error> = None;
    let mut final_line = None;
    let mut print = |summary: &demo::DemoSummary| {
        let line = demo::final_line(&summary.totals, k);
        // The chain advice, as /metrics exports it (a tree's is in the summary only).
        let advice = summary
            .advice()
            .ok()
            .zip(summary.costs.cost_model().ok())
            .filter(|_| summary.tree.is_none())
            .map(|(a, c)| demo::advice_line(&a, &c));
        let mut out = stdio::stdout();
        let written = summary
            .metrics_addr
            .map_or(Ok(()), |addr| {
                writeln!(out, "metrics served on http://{addr}/metrics")
            })
            .and_then(|()| writeln!(out, "{summary}"))
            .and_then(|()| advice.map_or(Ok(()), |l| writeln!(out, "{l}")))
            .and_then(|()| writeln!(out, "{}", demo::requests_line(&summary.finished)))
            .and_then(|()| writeln!(out, "{line}"))
            .and_then(|()| out.flush());
        if let Err(e) = written {
            stdout_error = Some(e);
            shutdown.request(Reason::Output);
        }
        final_line = Some(line);
    };
    if a.sweep_k {
        return run_sweep(&a, cfg, &corpus);
    }
    let verifier = open_backend(a.backend, a.threads, a.device)?;
    let readback = verifier.readback().map_err(backend_error)?;
    let ran = if cfg.tree.is_some() {
        demo::run_tree(&cfg, &corpus, verifier, readback, &mut stderr, &mut print)
    } else {
        demo::run(&cfg, &corpus, verifier, readback, &mut stderr, &mut print)
    };
    let final_line = final_line.unwrap_or_default();
    if let Some(e) = stdout_error {
        // The counts were flushed and logged; give the totals on stderr, which may still work.
        return Err(CliError::Output(format!(
            "cannot write the summary to stdout: {e}; the counters were flushed: {final_line}"
        )));
    }
    if logger.failed_writes() != 0 {
        let why = if stdio::guard().stderr {
            "stderr was closed when the program started".into()
        } else {
            logger
                .first_error()
                .map_or_else(|| "unknown error".into(), |k| k.to_string())
        };
        let msg = format!(
            "{} log lines could not be written to stderr ({why}); the counters were flushed",
            logger.failed_writes(),
        );
        // stderr is what failed: say it on stdout as well, after the FINAL line.
        let mut out = stdio::stdout();
        let _ = writeln!(out, "error: {msg}").and_then(|()| out.flush());
        return Err(CliError::Output(msg));
    }
    ran.map_err(|e| match e {
        demo::DemoError::Config(_)
        | demo::DemoError::Corpus(_)
        | demo::DemoError::Label(_)
        | demo::DemoError::ConstLabel(_) => CliError::Usage(e.to_string()),
        _ => CliError::Run(e.to_string()),
    })?;
    Ok(())
}

/// `specula demo --sweep-k`: the calibration run and the runs at k = 1..8 (each on a fresh
/// backend, quietly: no log lines between the runs' progress), the report on stdout; exit 1
/// when the advised k misses the best measured throughput by more than 5 %.
fn run_sweep(a: &DemoArgs, mut cfg: DemoConfig, corpus: &str) -> Result<(), CliError> {
    if a.duration.is_none() && a.tokens.is_none() {
        cfg.duration = Some(Duration::from_secs(3));
    }
    // One line per run at most: a log interval past the run's end.
    cfg.log_interval = cfg.duration.unwrap_or(Duration::from_secs(3)) + Duration::from_secs(3600);
    cfg.progress = false;
    let mut err = std::io::stderr();
    let mut n = 0;
    let report = demo::sweep_k(&cfg, a.sweep_rounds as usize, |c| {
        n += 1;
        let _ = writeln!(err, "sweep-k: run {n}: k={}", c.k);
        let verifier = open_backend(a.backend, a.threads, a.device)
            .map_err(|e| demo::DemoError::Config(e.to_string()))?;
        let readback = verifier
            .readback()
            .map_err(|e| demo::DemoError::Config(e.to_string()))?;
        demo::run(
            c,
            corpus,
            verifier,
            readback,
            &mut std::io::sink(),
            &mut |_| {},
        )
    })
    .map_err(|e| match e {
        demo::DemoError::Config(_) | demo::DemoError::Corpus(_) => CliError::Usage(e.to_string()),
        _ => CliError::Run(e.to_string()),
    })?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{report}")
        .and_then(|()| out.flush())
        .map_err(|e| CliError::Output(format!("cannot write the report to stdout: {e}")))?;
    if report.passed() {
        Ok(())
    } else {
        Err(CliError::Run(format!(
            "the advised k={} reached {:.3} of the best measured throughput (k={}), below {:.2}",
            report.recommended,
            report.ratio(),
            report.best_measured(),
            1.0 - demo::SWEEP_TOLERANCE
        )))
    }
}

/// `--threads` may ask for at most this many threads per CPU.
pub const MAX_THREADS_PER_CPU: usize = 4;

/// The largest `--device` ordinal.
pub const MAX_DEVICE: u16 = 1023;

/// `--threads` within [`MAX_THREADS_PER_CPU`] per CPU (exit 2 beyond: starting 100 000 threads
/// takes a minute before it fails).
fn check_threads(threads: usize) -> Result<(), CliError> {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let max = cpus.saturating_mul(MAX_THREADS_PER_CPU);
    if threads > max {
        return Err(CliError::Usage(format!(
            "--threads {threads} is more than {MAX_THREADS_PER_CPU} per CPU: at most {max} on \
             this machine's {cpus} CPUs (0 = one per CPU)"
        )));
    }
    Ok(())
}

/// Opens `--backend` the way a library user does, with [`specula::Backend::open`]: `--threads`
/// is the CPU backend's number, `--device` a GPU backend's. `--threads` may ask for at most
/// [`MAX_THREADS_PER_CPU`] threads per CPU (exit 2 beyond: starting 100 000 threads takes a
/// minute before it fails).
pub fn open_backend(
    kind: BackendKind,
    threads: usize,
    device: u16,
) -> Result<specula::Backend<MAX_K>, CliError> {
    let index = match kind {
        BackendKind::Cpu => {
            check_threads(threads)?;
            Some(threads)
        }
        BackendKind::Reference => None,
        _ => Some(device.into()), // a GPU backend's device ordinal
    };
    specula::Backend::open(&BackendSpec { kind, index }).map_err(backend_error)
}

/// A backend failure as a command error, by its [`ErrorKind`]: not compiled in is exit 3; no
/// driver, device or kernel compiler exit 4 (each line starts with what is missing); refused
/// input exit 2; anything else a run failure (exit 1).
pub fn backend_error(e: BackendError) -> CliError {
    let name = match e.backend() {
        Some(BackendKind::Cuda) => "CUDA",
        Some(BackendKind::Rocm) => "ROCm",
        _ => "backend",
    };
    let gpu = matches!(e.backend(), Some(BackendKind::Cuda | BackendKind::Rocm));
    match e.kind() {
        ErrorKind::NotCompiledIn => {
            let feature = e.backend().and_then(BackendKind::feature).unwrap_or("cuda");
            CliError::Backend(format!(
                "this specula was not compiled with {name} support (rebuild with `--features \
                 {feature}`)"
            ))
        }
        ErrorKind::NoDriver if gpu => CliError::Unavailable(match e.backend() {
            Some(BackendKind::Rocm) => {
                format!("no ROCm runtime: the HIP runtime (libamdhip64) could not be loaded ({e})")
            }
            _ => format!(
                "no CUDA driver: the driver library (libcuda.so.1 / nvcuda.dll) could not be \
                 loaded ({e})"
            ),
        }),
        ErrorKind::NoCompiler if gpu => CliError::Unavailable(match e.backend() {
            Some(BackendKind::Rocm) => format!(
                "no hiprtc: the ROCm backend compiles its kernel at run time and hiprtc could \
                 not be loaded ({e})"
            ),
            _ => format!(
                "no NVRTC: the CUDA backend compiles its kernel at run time and libnvrtc could \
                 not be loaded ({e})"
            ),
        }),
        ErrorKind::NoDevice if gpu => CliError::Unavailable(format!(
            "no {name} device: the driver reports none, or none with the --device ordinal ({e})"
        )),
        k if k.is_unavailable() => CliError::Unavailable(format!("no {name} available: {e}")),
        ErrorKind::InvalidInput => CliError::Usage(e.to_string()),
        _ => CliError::Run(e.to_string()),
    }
}

fn main() -> ExitCode {
    // First, before anything opens a file or socket: a closed stdout or stderr is held on
    // /dev/null and reported as failed on every write (exit 5), never silently lost.
    stdio::guard();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_exit(&e),
    };
    // `specula …` log records to stderr (the library emits through `log`; the program picks
    // the logger): a failed write is counted and stops the demo, never a panic.
    let logger: &'static LineLogger = Box::leak(Box::new(LineLogger::new(
        Box::new(stdio::stderr()),
        log::LevelFilter::Info,
    )));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
    let r = match cli.command {
        Command::Demo(a) => run_demo(a, logger),
        Command::Bench(a) => bench::run(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut err = stdio::stderr();
            let _ = writeln!(err, "error: {e}").and_then(|()| err.flush());
            ExitCode::from(e.code())
        }
    }
}

/// What clap's parse ends in: `--help` and `--version` (exit 0, or 5 when their text cannot
/// be written: clap itself would exit 0) and bad arguments (exit 2, written to stderr, whose
/// own failure does not change the code).
fn clap_exit(e: &clap::Error) -> ExitCode {
    let styled = e.render();
    let text = |terminal: bool| {
        if terminal {
            styled.ansi().to_string()
        } else {
            styled.to_string()
        }
    };
    if e.use_stderr() {
        let text = text(std::io::stderr().is_terminal());
        let mut err = stdio::stderr();
        let _ = write!(err, "{text}").and_then(|()| err.flush());
        return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
    }
    let text = text(std::io::stdout().is_terminal());
    let mut out = stdio::stdout();
    match write!(out, "{text}").and_then(|()| out.flush()) {
        Ok(()) => ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(0)),
        Err(err) => {
            let mut stderr = stdio::stderr();
            let _ = writeln!(stderr, "error: cannot write to stdout: {err}");
            ExitCode::from(CliError::Output(String::new()).code())
        }
    }
}
