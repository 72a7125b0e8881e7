//! The `specula demo` loop: n-gram draft and target models, a real verifier, every sink wired.
//!
//! A module of the program, not of the library: its unit tests and the Prometheus check (through
//! the binary) run the very loop a newcomer runs, and a runtime depending on `specula` compiles
//! none of it.

use crate::ngram::{NgramModel, SplitMix64, Vocab, argmax, sample};
use crate::tree_demo::{TreeShape, TreeStep};
// The pieces the tree drafter shares with this loop live below both.
pub use crate::step::{DemoError, MAX_K};
use crate::step::{Models, Request, Step, check_order, stream_seeds};
use specula::OutputBuffers;
use specula::advice::{CostSource, Sources, cost_slot, request_slot};
use specula::backend::Backend;
use specula::clock::StdClock;
use specula::http::{MetricsServer, ServerConfig};
use specula::log_sink::{LogSink, MIN_PERIOD};
use specula::prom::{ConstLabels, LabelError, Options, SpecCollector, VllmEngineMetrics};
use specula::shutdown::{Reason, Shutdown, finish};
use specula::specula_core::metrics::{
    Advice, AdviceError, CostMeter, CostModel, StepTiming, TreeCostModel, advise, advise_tree,
};
use specula::specula_core::verify::{
    Batch, Check, Dims, Drafts, Filter, Logits, Method, Param, Streams, Verifier,
};
use specula::specula_core::{
    Clock, Counters, Extremes, FinishedRequests, Readback, RequestAcceptance,
};
use specula::ticker::Ticker;
use specula::wiring::wire;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The demo's default `model_name` label.
pub const DEFAULT_MODEL_NAME: &str = "specula-demo-ngram";

// The corpus the models train on, with them (the tree comparison trains on it too).
pub use crate::ngram::CORPUS;

/// Demo settings.
#[derive(Clone, Debug)]
pub struct DemoConfig {
    /// Draft length per step (1..=[`MAX_K`]).
    pub k: usize,
    /// Verification method.
    pub method: Method,
    /// Seed of the prompts, the draft sampler and the verifier's streams.
    pub seed: u64,
    /// Requests verified together each step.
    pub batch: usize,
    /// Stop after this many emitted tokens (all requests together).
    pub max_tokens: Option<u64>,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Log line period.
    pub log_interval: Duration,
    /// Counter collection period.
    pub collect_interval: Duration,
    /// Serve `/metrics` here.
    pub metrics_addr: Option<SocketAddr>,
    /// Run as a small vLLM-compatible engine: export the `vllm:` names (engine label "0"),
    /// the engine metrics vLLM's dashboards read (`vllm:num_requests_running`,
    /// `vllm:generation_tokens_total`, `vllm:inter_token_latency_seconds`), and log vLLM's
    /// `SpecDecoding metrics: ` line instead of the native one.
    pub vllm_compat: bool,
    /// The `model_name` label on every series (vLLM's served model name).
    pub model_name: String,
    /// More constant labels on every series, `(name, value)`, validated at start.
    pub labels: Vec<(String, String)>,
    /// Keep serving `/metrics` this long after the run, so the final totals can be scraped.
    pub linger: Duration,
    /// Target model order (3 = trigram).
    pub target_order: usize,
    /// Draft model order (2 = bigram).
    pub draft_order: usize,
    /// Engine label.
    pub label: String,
    /// Print a progress line to stderr about once a second.
    pub progress: bool,
    /// Stops the run early when requested (the `specula` program requests it on SIGINT and
    /// SIGTERM, and when its output fails): the loop ends after the current step, the counters
    /// are flushed and logged, the summary is produced; any request after the one that stopped
    /// the run (after the run ended, when it ran its course) ends [`linger`](Self::linger),
    /// or skips it when it came first.
    pub shutdown: Shutdown,
    /// How the target distribution is sampled: temperature, top-k / top-p / min-p, and how
    /// many requests are greedy (issue 13's mixed batches).
    pub sampling: Sampling,
    /// Draft token trees of this shape instead of `k`-token chains ([`run_tree`]: the
    /// backend's tree verifier; depth at most [`MAX_K`]). `None`: chains.
    pub tree: Option<TreeShape>,
    /// A request finishes once it has emitted this many tokens, and a new prompt takes its
    /// place in the batch (its acceptance goes into the finished-request histogram); 0: requests
    /// never finish.
    pub request_tokens: u64,
    /// Log the native line's detailed form (acceptance lengths, conditional acceptance, advice;
    /// [`LogSink::with_detail`]).
    pub log_detail: bool,
    /// The sliding window of `/metrics`' `window="recent"` gauges
    /// ([`SpecCollector::with_advice_window`]).
    pub advice_window: Duration,
}

/// The demo's sampling parameters, applied by the verifier itself (target logits with a
/// temperature per request, per-request filters), as a serving engine hands them over.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Hand the target rows over as logits (`ln p`) with this temperature (`≥ 0`; `0`:
    /// every request greedy). `None`: as probabilities (temperature 1).
    pub temperature: Option<f32>,
    /// The filter of every request (top-k, top-p, min-p; [`Filter::NONE`]: off).
    pub filter: Filter,
    /// The first this many requests of the batch are greedy (temperature 0, an argmax
    /// drafter), the others sampled: one batch, one call. Implies logits.
    pub greedy_requests: usize,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            temperature: None,
            filter: Filter::NONE,
            greedy_requests: 0,
        }
    }
}

impl Sampling {
    /// Whether a filter is on.
    #[must_use]
    pub fn filters(&self) -> bool {
        self.filter.is_active()
    }

    /// Whether the target rows are handed over as logits.
    #[must_use]
    pub fn logits(&self) -> bool {
        self.temperature.is_some() || self.greedy_requests > 0
    }

    /// Checks the ranges (the verifier would refuse them too, but later and per batch).
    fn check(&self, batch: usize) -> Result<(), String> {
        if let Some(t) = self
            .temperature
            .filter(|t| !(0.0..f32::INFINITY).contains(t))
        {
            return Err(format!("temperature must be finite and ≥ 0, got {t}"));
        }
        let f = self.filter;
        match f.out_of_range() {
            None => {}
            Some(Param::TopP) => return Err(format!("top-p must be in (0, 1], got {}", f.top_p)),
            Some(Param::MinP) => return Err(format!("min-p must be in [0, 1], got {}", f.min_p)),
            Some(p) => return Err(format!("{p:?} is out of its range")),
        }
        if self.greedy_requests > batch {
            return Err(format!(
                "greedy requests ({}) exceed the batch ({batch})",
                self.greedy_requests
            ));
        }
        Ok(())
    }
}

impl Default for DemoConfig {
    fn default() -> Self {
        Self {
            k: 4,
            method: Method::Rejection,
            seed: 0x5eed,
            batch: 8,
            max_tokens: None,
            duration: Some(Duration::from_secs(10)),
            log_interval: Duration::from_secs(5),
            collect_interval: Duration::from_millis(100),
            metrics_addr: None,
            vllm_compat: false,
            model_name: DEFAULT_MODEL_NAME.into(),
            labels: Vec::new(),
            linger: Duration::ZERO,
            target_order: 3,
            draft_order: 2,
            label: "rank0".into(),
            progress: false,
            shutdown: Shutdown::new(),
            sampling: Sampling::default(),
            tree: None,
            request_tokens: 512,
            log_detail: false,
            advice_window: specula::prom::DEFAULT_ADVICE_WINDOW,
        }
    }
}

/// What a demo run produced.
#[derive(Clone, Debug)]
pub struct DemoSummary {
    /// Final totals, as published to the slot (what every sink saw).
    pub totals: Counters<MAX_K>,
    /// Wall time of the decode loop.
    pub elapsed: Duration,
    /// Verification steps (batches).
    pub steps: u64,
    /// The start of request 0's text: prompt, then generated characters.
    pub sample: String,
    /// Where `/metrics` was served.
    pub metrics_addr: Option<SocketAddr>,
    /// Why the run stopped before its budget, if it did ([`DemoConfig::shutdown`]).
    pub stopped_by: Option<Reason>,
    /// The step timings the advice is computed from: per step, the part that grows with `k`
    /// (the `k` draft rows and `k` of the `k + 1` target rows, which the n-gram target computes
    /// one after another; the verification where it reduces every row) and the rest (one
    /// target row, the collector's step, the bookkeeping). For token trees, per draft node.
    pub costs: CostMeter,
    /// The tree shape of a tree run ([`DemoConfig::tree`]).
    pub tree: Option<TreeShape>,
    /// The finished requests' acceptance histogram ([`DemoConfig::request_tokens`]).
    pub finished: FinishedRequests,
    /// CPU time of the decode loop's thread, where the platform tells it (Linux): with
    /// `--threads 1` all of the loop's work, unaffected by other processes on the machine.
    pub cpu: Option<Duration>,
}

impl DemoSummary {
    /// Emitted tokens per second of decode loop.
    pub fn tokens_per_second(&self) -> Option<f64> {
        let s = self.elapsed.as_secs_f64();
        (s > 0.0).then(|| self.totals.emitted_tokens as f64 / s)
    }

    /// Emitted tokens per second of the decode thread's CPU time.
    pub fn tokens_per_cpu_second(&self) -> Option<f64> {
        let s = self.cpu?.as_secs_f64();
        (s > 0.0).then(|| self.totals.emitted_tokens as f64 / s)
    }

    /// The draft-length advice over the whole run (lifetime counters and step timings); for a
    /// tree run, the best depth to cut its tree at ([`advise_tree`], a cost per draft node).
    ///
    /// # Errors
    /// No draft or no timings.
    pub fn advice(&self) -> Result<Advice<MAX_K>, AdviceError> {
        let cost = self.costs.cost_model()?;
        match self.tree {
            None => advise(&self.totals, &cost),
            Some(shape) => {
                let mut per_depth = [0u32; MAX_K];
                let mut level = 1u32;
                for n in per_depth.iter_mut().take(shape.depth.min(MAX_K)) {
                    level = level.saturating_mul(shape.width as u32);
                    *n = level;
                }
                let per_node = TreeCostModel::new(0.0, cost.per_draft())?;
                advise_tree(
                    &self.totals,
                    &per_node,
                    &per_depth[..shape.depth.min(MAX_K)],
                )
            }
        }
    }
}

/// The line scripts parse for the finished requests: `REQUESTS finished=N drafted=N
/// rate_sum_micros=N low=N high=N`.
pub fn requests_line(f: &FinishedRequests) -> String {
    format!(
        "REQUESTS finished={} drafted={} rate_sum_micros={} low={} high={}",
        f.finished,
        f.drafted_requests(),
        f.rate_sum_micros,
        f.low,
        f.high
    )
}

/// The line scripts parse for the advice: `ADVICE recommended=K cost_ratio=R
/// rejection_saving=S speedup=S1,S2,… expected_tokens=E1,E2,…` (one value per measured draft
/// length).
pub fn advice_line(a: &Advice<MAX_K>, cost: &CostModel) -> String {
    let join = |f: &dyn Fn(f64, f64) -> f64| {
        a.iter()
            .map(|(_, e, s)| format!("{:.6}", f(e, s)))
            .collect::<Vec<_>>()
            .join(",")
    };
    format!(
        "ADVICE recommended={} cost_ratio={:.6} rejection_saving={:.9} speedup={} \
         expected_tokens={}",
        a.recommended(),
        cost.per_draft(),
        cost.rejection_saving(),
        join(&|_, s| s),
        join(&|e, _| e)
    )
}

impl std::fmt::Display for DemoSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = &self.totals;
        let pct = |x: Option<f64>| x.map_or("n/a".into(), |v| format!("{:.1}%", v * 100.0));
        writeln!(f, "== specula demo summary ==")?;
        if let Some(r) = self.stopped_by {
            writeln!(f, "stopped early by:        {r}")?;
        }
        writeln!(f, "steps (batches):         {}", self.steps)?;
        writeln!(f, "drafts:                  {}", t.drafts)?;
        writeln!(f, "draft tokens:            {}", t.draft_tokens)?;
        writeln!(f, "accepted tokens:         {}", t.accepted_tokens)?;
        writeln!(f, "emitted tokens:          {}", t.emitted_tokens)?;
        writeln!(f, "acceptance rate:         {}", pct(t.acceptance_rate()))?;
        writeln!(
            f,
            "mean acceptance length:  {}",
            t.mean_acceptance_length()
                .map_or("n/a".into(), |v| format!("{v:.3}"))
        )?;
        if t.tree_drafts != 0 {
            writeln!(f, "tree drafts:             {}", t.tree_drafts)?;
            writeln!(f, "tree draft nodes:        {}", t.tree_draft_tokens)?;
            writeln!(
                f,
                "mean tree size:          {}",
                t.mean_tree_size()
                    .map_or("n/a".into(), |v| format!("{v:.3} nodes"))
            )?;
        }
        let positions = t.drafted_per_position.iter().filter(|&&n| n != 0).count();
        if positions != 0 {
            let lengths: Vec<String> = t
                .acceptance_lengths()
                .take(positions + 1)
                .enumerate()
                .map(|(j, n)| format!("{j}:{n}"))
                .collect();
            writeln!(f, "acceptance lengths:      {}", lengths.join(" "))?;
            let conditional: Vec<String> = (0..positions)
                .map(|i| {
                    t.conditional_acceptance(i)
                        .map_or("n/a".into(), |p| format!("{p:.3}"))
                })
                .collect();
            writeln!(f, "conditional acceptance:  {}", conditional.join(", "))?;
        }
        if let (Ok(a), Ok(c)) = (self.advice(), self.costs.cost_model()) {
            let by_k: Vec<String> = a.iter().map(|(_, _, s)| format!("{s:.2}x")).collect();
            let (unit, k) = match self.tree {
                None => ("token", "k"),
                Some(_) => ("node", "depth"),
            };
            writeln!(
                f,
                "draft cost ratio:        {:.4} plain target steps per draft {unit}",
                c.per_draft()
            )?;
            if self.tree.is_none() {
                writeln!(
                    f,
                    "rejection saving:        {:.4} plain target steps per rejected step",
                    c.rejection_saving()
                )?;
            }
            writeln!(
                f,
                "advice:                  {k}={} (expected speedup {:.2}x; by {k}: {})",
                a.recommended(),
                a.best_speedup(),
                by_k.join(", ")
            )?;
        }
        if self.finished.finished != 0 {
            writeln!(
                f,
                "finished requests:       {} (low acceptance: {}, high acceptance: {})",
                self.finished.finished, self.finished.low, self.finished.high
            )?;
        }
        writeln!(
            f,
            "throughput:              {} tokens/s over {:.2} s",
            self.tokens_per_second()
                .map_or("n/a".into(), |v| format!("{v:.0}")),
            self.elapsed.as_secs_f64()
        )?;
        write!(f, "sample: {:?}", self.sample)
    }
}

/// The final-totals line scripts parse: `FINAL drafts=… draft_tokens=… accepted_tokens=…
/// emitted_tokens=… accepted_per_position=a,b,…` (one count per position of the draft
/// length `k`, or per depth of a tree), then `tree_drafts=… tree_draft_tokens=…` when token
/// trees were counted.
pub fn final_line(t: &Counters<MAX_K>, k: usize) -> String {
    let per_pos: Vec<String> = t.accepted_per_position[..k.clamp(1, MAX_K)]
        .iter()
        .map(u64::to_string)
        .collect();
    let mut line = format!(
        "FINAL drafts={} draft_tokens={} accepted_tokens={} emitted_tokens={} \
         accepted_per_position={}",
        t.drafts,
        t.draft_tokens,
        t.accepted_tokens,
        t.emitted_tokens,
        per_pos.join(",")
    );
    if t.tree_drafts != 0 {
        line.push_str(&format!(
            " tree_drafts={} tree_draft_tokens={}",
            t.tree_drafts, t.tree_draft_tokens
        ));
    }
    line
}

impl DemoConfig {
    /// Positions per draft: the tree's depth with [`tree`](Self::tree), else `k`.
    #[must_use]
    pub fn draft_len(&self) -> usize {
        self.tree.map_or(self.k, |t| t.depth)
    }

    /// Checks every setting that needs neither the corpus nor the verifier, in constant time
    /// (no setting is looped over): `k` 1..=[`MAX_K`], batch 1..=4096, a token budget or a
    /// duration, intervals of at least [`MIN_PERIOD`], model orders
    /// 1..=[`MAX_ORDER`](crate::ngram::MAX_ORDER), the constant labels, and the chain's
    /// sampling ranges or the tree's shape (depth at most [`MAX_K`]), method and sampling. The
    /// run functions check these first; a program checks them before it reads a corpus or
    /// opens a backend.
    ///
    /// # Errors
    /// [`DemoError::Config`], or [`DemoError::ConstLabel`] for a bad label.
    pub fn check(&self) -> Result<(), DemoError> {
        if !(1..=MAX_K).contains(&self.k) {
            return Err(DemoError::Config(format!(
                "k must be 1..={MAX_K}, got {}",
                self.k
            )));
        }
        if self.batch == 0 || self.batch > 4096 {
            return Err(DemoError::Config("batch must be 1..=4096".into()));
        }
        if self.max_tokens.is_none() && self.duration.is_none() {
            return Err(DemoError::Config(
                "give a token budget or a duration".into(),
            ));
        }
        for (name, d) in [
            ("log interval", self.log_interval),
            ("collect interval", self.collect_interval),
        ] {
            if d < MIN_PERIOD {
                return Err(DemoError::Config(format!(
                    "the {name} must be at least {} s (1 ms), got {} s",
                    MIN_PERIOD.as_secs_f64(),
                    d.as_secs_f64()
                )));
            }
        }
        check_order(self.target_order)?;
        check_order(self.draft_order)?;
        const_labels(self).map_err(DemoError::ConstLabel)?;
        match self.tree {
            None => self.sampling.check(self.batch).map_err(DemoError::Config),
            Some(shape) => {
                if !shape.is_valid() || shape.depth > MAX_K {
                    return Err(DemoError::Config(format!(
                        "tree {}x{}: width and depth at least 1, at most {} draft nodes and \
                         depth at most {MAX_K} (what the demo's counters track)",
                        shape.width,
                        shape.depth,
                        crate::tree_demo::TREE_K
                    )));
                }
                if !matches!(self.method, Method::Rejection | Method::Greedy) {
                    return Err(DemoError::Config(
                        "token trees in the demo use rejection sampling or greedy".into(),
                    ));
                }
                if self.sampling != Sampling::default() {
                    return Err(DemoError::Config(
                        "token trees in the demo take probabilities: no --temperature, --top-k, \
                         --top-p, --min-p or --greedy-requests"
                            .into(),
                    ));
                }
                Ok(())
            }
        }
    }
}

/// The constant labels of `cfg`: `model_name`, then [`DemoConfig::labels`] in order.
///
/// # Errors
/// A label that breaks Prometheus' rules, is reserved or given twice.
pub fn const_labels(cfg: &DemoConfig) -> Result<ConstLabels, LabelError> {
    let mut labels = ConstLabels::model_name(&cfg.model_name)?;
    for (n, v) in &cfg.labels {
        labels.push(n, v)?;
    }
    Ok(labels)
}

/// This thread's CPU time (user + system; clock ticks of 10 ms), on Linux
/// (`/proc/thread-self/stat`); `None` elsewhere.
fn thread_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')')?.1;
    let mut f = rest.split_whitespace().skip(11);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

/// Characters of request 0's text kept for the summary.
const SAMPLE_CHARS: usize = 300;

/// The chain drafter: `k` tokens per request from the draft model, verified by any
/// [`Verifier`], as probabilities or (with [`Sampling`]) logits and filters.
struct ChainStep<V> {
    verifier: V,
    method: Method,
    k: usize,
    vocab: usize,
    sampling: Sampling,
    ks: Vec<u32>,
    seeds: Vec<u64>,
    draft_ids: Vec<u32>,
    draft_probs: Vec<f32>,
    target_probs: Vec<f32>,
    target_logits: Vec<f32>,
    temperatures: Vec<f32>,
    filters: Vec<Filter>,
    /// The step's outputs, sized from its batch.
    out: OutputBuffers,
    ctx: Vec<u32>,
    /// The last step's (drafting, target rows, verification) time in ns.
    phases: (u64, u64, u64),
}

impl<V: Verifier<MAX_K>> ChainStep<V> {
    fn new(verifier: V, cfg: &DemoConfig, v: usize) -> Self {
        let (b, k) = (cfg.batch, cfg.k);
        let sampling = cfg.sampling;
        let target_len = b * (k + 1) * v;
        Self {
            verifier,
            method: cfg.method,
            k,
            vocab: v,
            sampling,
            ks: vec![k as u32; b],
            seeds: stream_seeds(cfg.seed, b),
            draft_ids: vec![0u32; b * k],
            draft_probs: vec![0f32; b * k * v],
            target_probs: vec![0f32; target_len],
            target_logits: vec![0f32; if sampling.logits() { target_len } else { 0 }],
            temperatures: (0..b)
                .map(|r| {
                    if r < sampling.greedy_requests {
                        0.0
                    } else {
                        sampling.temperature.unwrap_or(1.0)
                    }
                })
                .collect(),
            filters: vec![sampling.filter; b],
            out: OutputBuffers::new(),
            ctx: Vec::new(),
            phases: (0, 0, 0),
        }
    }
}

impl<V: Verifier<MAX_K>> Step for ChainStep<V> {
    fn step(
        &mut self,
        models: &Models,
        requests: &[Request],
        offsets: &[u64],
        rng: &mut SplitMix64,
    ) -> Result<(), DemoError> {
        let (k, v, keep) = (self.k, self.vocab, models.keep);
        let sampling = self.sampling;
        let method = self.method;
        let greedy = |r: usize| method == Method::Greedy || r < sampling.greedy_requests;
        let ctx = &mut self.ctx;
        // Two phases, timed for the advice: drafting every request, then the target rows.
        let started = Instant::now();
        for (r, req) in requests.iter().enumerate() {
            ctx.clear();
            ctx.extend_from_slice(&req.history[req.history.len().saturating_sub(keep)..]);
            for j in 0..k {
                let row = &mut self.draft_probs[(r * k + j) * v..][..v];
                models.draft.probs(ctx, row);
                let t = if greedy(r) {
                    argmax(row)
                } else {
                    sample(row, rng)
                };
                self.draft_ids[r * k + j] = t;
                ctx.push(t);
            }
        }
        let drafted = Instant::now();
        for (r, req) in requests.iter().enumerate() {
            ctx.clear();
            ctx.extend_from_slice(&req.history[req.history.len().saturating_sub(keep)..]);
            for j in 0..=k {
                let row = &mut self.target_probs[(r * (k + 1) + j) * v..][..v];
                models.target.probs(ctx, row);
                if j < k {
                    ctx.push(self.draft_ids[r * k + j]);
                }
            }
        }
        if sampling.logits() {
            // What an engine hands over: logits (here ln p of the n-gram model; −∞ masks).
            for (l, &p) in self.target_logits.iter_mut().zip(&self.target_probs) {
                *l = p.ln();
            }
        }
        let scored = Instant::now();
        self.phases = (
            specula::clock::duration_ns(drafted - started),
            specula::clock::duration_ns(scored - drafted),
            0,
        );
        let mut batch = Batch::dense(
            Dims { vocab: v, k_max: k },
            Drafts {
                k: &self.ks,
                ids: &self.draft_ids,
            },
            &self.target_probs,
            Streams {
                seed: &self.seeds,
                offset: offsets,
            },
        );
        if method == Method::Rejection {
            batch = batch.with_draft_probs(&self.draft_probs);
        }
        if sampling.logits() {
            batch = batch.with_target_logits(Logits {
                values: &self.target_logits,
                temperature: &self.temperatures,
            });
        }
        if sampling.filters() {
            batch = batch.with_filters(&self.filters);
        }
        let verified = self
            .verifier
            .verify(method, Check::Cheap, &batch, &mut self.out.fit(&batch))
            .map_err(|e| DemoError::Verify(format!("{e:?}")));
        self.phases.2 = specula::clock::duration_ns(scored.elapsed());
        verified
    }

    fn emitted(&self, r: usize) -> &[u32] {
        let n = self.out.accepted()[r] as usize + 1;
        &self.out.tokens()[r * (self.k + 1)..][..n]
    }

    fn draft_len(&self) -> usize {
        self.k
    }

    fn scaled_ns(&self) -> Option<u64> {
        // The k draft rows, and k of the k + 1 target rows: the n-gram target computes its rows
        // one after another, so its time grows with k (a GPU target's forward would not).
        // Verification grows with the rows it reduces where it reduces each one (greedy's
        // argmax, typical acceptance's entropy, a softmax of logits); rejection sampling over
        // probabilities reads two values per position and runs one race over the vocabulary
        // per request, whatever k: fixed.
        let (draft, target, verify) = self.phases;
        let per_row = self.method != Method::Rejection || self.sampling.logits();
        let rows = target + if per_row { verify } else { 0 };
        let k = self.k as u64;
        Some(draft + rows / (k + 1) * k)
    }
}

/// Runs the demo: trains the models on `corpus`, then decodes until the token budget or the
/// duration runs out, verifying every draft with `verifier`. `on_done` sees the summary as
/// soon as the loop ends, before the [`DemoConfig::linger`] period.
///
/// The collector reads the counters through `readback`, the backend's own [`Readback`] of
/// `verifier`'s counters (`CpuVerifier::readback`, `CudaReadback::new`,
/// `RocmReadback::new`): the decode loop never copies counts itself, exactly as a serving
/// engine would run.
///
/// (Run in the tests: `run_on_the_cpu_backend_emits_what_was_asked`.)
pub fn run<V, R>(
    cfg: &DemoConfig,
    corpus: &str,
    verifier: V,
    readback: R,
    progress_out: &mut dyn Write,
    on_done: &mut dyn FnMut(&DemoSummary),
) -> Result<DemoSummary, DemoError>
where
    V: Verifier<MAX_K>,
    R: Readback<MAX_K>,
    R::Error: Clone,
{
    check_chain(cfg, &verifier)?;
    run_with(
        cfg,
        corpus,
        |v| ChainStep::new(verifier, cfg, v),
        readback,
        |_, _| Ok(()),
        progress_out,
        on_done,
    )
}

/// [`run`] with the token-tree drafter ([`DemoConfig::tree`], required): every step drafts the
/// full `WIDTH`-ary tree of depth `DEPTH` per request on the draft model (greedy: the
/// top-`WIDTH` continuations of each node; rejection sampling: `WIDTH` continuations drawn from
/// the draft model, verified by SpecInfer's rule with their draft rows) and verifies the batch
/// with `verifier`'s tree verifier ([`Backend::verify_tree`]: any backend), which counts every
/// tree (`Counters::record_tree`). The collector reads those counts through `readback`
/// (`verifier`'s own, [`Backend::readback`]), so trees flow through the same
/// slot, log line, `/metrics` and summary as chains (`specula_tree_drafts_total`,
/// `specula_tree_draft_tokens_total`, per-depth acceptance in the per-position families).
///
/// (Run in the tests: `run_tree_counts_every_tree_as_a_draft`.)
///
/// # Errors
/// As [`run`]; [`DemoError::Config`] without a tree shape, for a depth above [`MAX_K`], a
/// method other than rejection sampling or greedy, or sampling settings (logits, filters).
pub fn run_tree<R>(
    cfg: &DemoConfig,
    corpus: &str,
    verifier: Backend<MAX_K>,
    readback: R,
    progress_out: &mut dyn Write,
    on_done: &mut dyn FnMut(&DemoSummary),
) -> Result<DemoSummary, DemoError>
where
    R: Readback<MAX_K>,
    R::Error: Clone,
{
    let Some(shape) = cfg.tree else {
        return Err(DemoError::Config("run_tree needs a tree shape".into()));
    };
    cfg.check()?;
    run_with(
        cfg,
        corpus,
        |v| {
            TreeStep::new(
                verifier,
                shape,
                cfg.method,
                stream_seeds(cfg.seed, cfg.batch),
                v,
            )
        },
        readback,
        |_, _| Ok(()),
        progress_out,
        on_done,
    )
}

/// The checks of the chain drafter's settings against what `verifier` supports.
fn check_chain<V: Verifier<MAX_K>>(cfg: &DemoConfig, verifier: &V) -> Result<(), DemoError> {
    if cfg.tree.is_some() {
        return Err(DemoError::Config(
            "a tree shape is run by run_tree (the backend's tree verifier)".into(),
        ));
    }
    cfg.check()?;
    let support = verifier.support();
    if cfg.sampling.logits() && !support.logits {
        return Err(DemoError::Config(
            "this backend does not verify from logits (the CPU and reference backends do)".into(),
        ));
    }
    if cfg.sampling.filters() && !support.filters {
        return Err(DemoError::Config(
            "this backend does not apply top-k / top-p / min-p (the CPU and reference backends \
             do)"
            .into(),
        ));
    }
    Ok(())
}

/// The demo loop around one [`Step`] (made by `make_step` for the vocabulary size);
/// `after_verify` runs after every verified batch, before the collector's step.
fn run_with<S, R, F>(
    cfg: &DemoConfig,
    corpus: &str,
    make_step: impl FnOnce(usize) -> S,
    readback: R,
    mut after_verify: F,
    progress_out: &mut dyn Write,
    on_done: &mut dyn FnMut(&DemoSummary),
) -> Result<DemoSummary, DemoError>
where
    S: Step,
    R: Readback<MAX_K>,
    R::Error: Clone,
    F: FnMut(&mut S, &mut R) -> Result<(), DemoError>,
{
    cfg.check()?;
    let labels = const_labels(cfg).map_err(DemoError::ConstLabel)?;
    let vocab = Vocab::from_text(corpus).map_err(DemoError::Corpus)?;
    let ids = vocab.encode(corpus);
    let v = vocab.len();
    let models = Models {
        target: NgramModel::train(&ids, v, cfg.target_order).map_err(DemoError::Corpus)?,
        draft: NgramModel::train(&ids, v, cfg.draft_order).map_err(DemoError::Corpus)?,
        vocab: v,
        keep: cfg.target_order.max(cfg.draft_order),
    };
    let draft_len = cfg.draft_len();

    let wired = wire::<MAX_K, _>([cfg.label.as_str()]).map_err(DemoError::Label)?;
    let clock = StdClock::new();
    let slots = wired.slots.clone();
    // The advice's inputs beside the counters: the step timings (chains: a tree's cost is not
    // a chain's, so trees get no chain advice) and the finished-request histogram.
    let (mut costs, cost_reader) = cost_slot();
    let (mut finished, finished_reader) = request_slot(Extremes::default());
    let mut sources = Sources::new().with_requests(&cfg.label, finished_reader);
    if cfg.tree.is_none() {
        sources = sources.with_costs(&cfg.label, CostSource::Measured(cost_reader));
    }
    // In compat mode the demo is a small vLLM engine (engine index 0) for the dashboards.
    let engine = cfg.vllm_compat.then(|| VllmEngineMetrics::new(&labels, 0));
    let server = match cfg.metrics_addr {
        Some(addr) => {
            let mut registry = SpecCollector::new(
                slots.clone(),
                Options {
                    vllm_compat: cfg.vllm_compat,
                },
            )
            .with_clock(clock)
            .with_labels(labels.clone())
            .with_draft_len(draft_len)
            .map_err(|e| DemoError::Config(e.to_string()))?
            .with_sources(sources.clone())
            .with_advice_window(cfg.advice_window)
            .into_registry();
            if let Some(engine) = &engine {
                engine.register(&mut registry);
            }
            let config = ServerConfig {
                addr,
                ..ServerConfig::default()
            };
            Some(MetricsServer::start(config, Arc::new(registry)).map_err(DemoError::Serve)?)
        }
        None => None,
    };
    let metrics_addr = server.as_ref().map(MetricsServer::local_addr);
    let Some(writer) = wired.writers.into_iter().next() else {
        return Err(DemoError::Config("no slot was wired".into()));
    };
    // One start for the log grid and the collector's deadlines: the collector times its
    // readbacks so that one has been published before each log tick.
    let start_ns = clock.now_ns();
    let mut driver = Ticker::new(readback, writer, cfg.collect_interval, clock)
        .map_err(|e| DemoError::Config(e.to_string()))?;
    driver
        .collector_mut()
        .set_deadlines(
            specula::clock::duration_ns(cfg.log_interval.max(specula::log_sink::MIN_PERIOD)),
            start_ns,
        )
        .map_err(|e| DemoError::Config(e.to_string()))?;
    let mut log = LogSink::new(&slots, cfg.log_interval, start_ns, log::Level::Info)
        .map_err(|e| DemoError::Config(e.to_string()))?;
    if cfg.vllm_compat {
        log = log.with_vllm_lines(draft_len);
    }
    if cfg.log_detail {
        log = log.with_detail(sources.clone());
    }
    let log = log.spawn(clock).map_err(DemoError::Thread)?;

    // Prompts: random 16-character windows of the corpus.
    let mut rng = SplitMix64::new(cfg.seed);
    let prompt_len = 16.min(ids.len());
    let prompt = |rng: &mut SplitMix64| {
        let at = rng.below(ids.len() - prompt_len + 1);
        Request {
            history: ids[at..at + prompt_len].to_vec(),
            acceptance: RequestAcceptance::NEW,
            emitted: 0,
        }
    };
    let mut requests: Vec<Request> = (0..cfg.batch).map(|_| prompt(&mut rng)).collect();
    let mut sample_ids = requests[0].history.clone();

    let b = cfg.batch;
    let mut offsets = vec![0u64; b];
    let keep = models.keep;
    let mut step = make_step(models.vocab);

    let started = Instant::now();
    let cpu_started = thread_cpu();
    let mut last_progress = started;
    // The end of the previous step: every request gets its next tokens once per step, so the
    // time between two step ends is each request's inter-token latency (vLLM's definition:
    // the time since that request's previous output).
    let mut last_output = started;
    if let Some(e) = &engine {
        e.set_running(b as i64);
    }
    let mut steps = 0u64;
    let mut emitted = 0u64;
    let mut stopped_by = None;
    loop {
        if cfg.shutdown.is_requested() {
            stopped_by = cfg.shutdown.reason();
            break;
        }
        if cfg.max_tokens.is_some_and(|m| emitted >= m)
            || cfg.duration.is_some_and(|d| started.elapsed() >= d)
        {
            break;
        }
        let step_started = Instant::now();
        step.step(&models, &requests, &offsets, &mut rng)?;
        // The verifier counts (verification and counting are one operation); the collector
        // reads them back through the backend's readback and publishes them on its grid.
        after_verify(&mut step, driver.collector_mut().readback_mut())?;
        driver.step();

        let step_emitted_before = emitted;
        let k = step.draft_len();
        let mut rejected = 0u32;
        for (r, req) in requests.iter_mut().enumerate() {
            let new = step.emitted(r);
            rejected += u32::from(new.len() <= k);
            req.history.extend_from_slice(new);
            if req.history.len() > 4096 {
                req.history.drain(..req.history.len() - keep);
            }
            if r == 0 && sample_ids.len() < SAMPLE_CHARS {
                sample_ids.extend_from_slice(new);
            }
            emitted += new.len() as u64;
            offsets[r] = offsets[r].wrapping_add(1);
            // The engine's per-request accumulator, from the verification's accepted count
            // (host values the loop already has: no readback).
            req.acceptance
                .record(k, new.len() - 1)
                .map_err(|e| DemoError::Verify(e.to_string()))?;
            req.emitted += new.len() as u64;
            if cfg.request_tokens != 0 && req.emitted >= cfg.request_tokens {
                finished.finish(&req.acceptance);
                *req = prompt(&mut rng);
            }
        }
        // The step's time, split into what grows with k and the rest, for the advice's cost
        // model (the whole step, the collector's tick and the bookkeeping included, so the
        // model's step times add up to the loop's).
        // The outcome (requests that rejected) fits what a rejection saves over a whole
        // acceptance: the bonus token's sampling against the recovered token's.
        if let Some(scaled) = step.scaled_ns() {
            let total = specula::clock::duration_ns(step_started.elapsed());
            costs.record(&StepTiming {
                draft_len: step.draft_units(),
                fixed_ns: total.saturating_sub(scaled),
                scaled_ns: scaled,
                requests: requests.len() as u32,
                rejected,
            });
        }
        if let Some(e) = &engine {
            let now = Instant::now();
            e.add_generation_tokens(emitted - step_emitted_before);
            e.observe_inter_token_latency(now.duration_since(last_output).as_secs_f64(), b);
            last_output = now;
        }
        steps += 1;
        if cfg.progress && last_progress.elapsed() >= Duration::from_secs(1) {
            last_progress = Instant::now();
            let s = started.elapsed().as_secs_f64();
            let _ = write!(
                progress_out,
                "\r[{s:6.1} s] {emitted} tokens, {:.0} tokens/s   ",
                emitted as f64 / s
            );
            let _ = progress_out.flush();
        }
    }
    let elapsed = started.elapsed();
    let cpu = thread_cpu()
        .zip(cpu_started)
        .map(|(end, start)| end.saturating_sub(start));
    if let Some(e) = &engine {
        e.set_running(0);
    }
    // The request that stopped the loop, if one did, is the first; any request after it ends
    // the linger, even one made before the loop saw the first (two signals a millisecond
    // apart both arrive during one step): counted from the first, not from the loop's end.
    let stop_requests = u64::from(stopped_by.is_some());
    if cfg.progress {
        let _ = writeln!(progress_out);
    }
    if let Some(r) = stopped_by {
        log::info!(
            target: specula::log_sink::TARGET,
            "stopping on {r} after {:.2} s: flushing the counters",
            elapsed.as_secs_f64()
        );
    }
    // Shutdown order: flush the collector (last counts to the slot), then stop the log sink
    // (which drains once more); the Prometheus collector reads the slot at scrape time.
    let done = finish(&mut driver, Some(log));
    let error = match (done.flushed, done.log) {
        (Err(e), _) => Some(DemoError::Readback(e.to_string())),
        (Ok(_), Some(Err(p))) => Some(DemoError::LogThread(p)),
        _ => None,
    };
    sample_ids.truncate(SAMPLE_CHARS);
    let summary = DemoSummary {
        totals: slots.total().counters,
        elapsed,
        steps,
        sample: vocab.decode(&sample_ids),
        metrics_addr,
        stopped_by,
        costs: *costs.meter(),
        tree: cfg.tree,
        finished: *finished.finished(),
        cpu,
    };
    on_done(&summary);
    if let Some(server) = server {
        if !cfg.linger.is_zero() && cfg.shutdown.requests() <= stop_requests {
            log::info!(
                target: specula::log_sink::TARGET,
                "serving final totals on http://{}/metrics for {:.1} s (SIGINT/SIGTERM ends it)",
                server.local_addr(),
                cfg.linger.as_secs_f64()
            );
            // Ends early on a request beyond the one that stopped the run (a second signal).
            if cfg.shutdown.wait_for_request(stop_requests, cfg.linger) {
                log::info!(target: specula::log_sink::TARGET, "linger ended by request");
            }
        }
        server.shutdown();
    }
    match error {
        Some(e) => Err(e),
        None => Ok(summary),
    }
}

/// The throughput `specula demo --sweep-k` compares: emitted tokens per second of the decode
/// thread's CPU time where the platform tells it (with `--threads 1` that is all of the loop's
/// work, and other processes on a shared machine do not slow it down), else per second of wall
/// time.
fn sweep_throughput(s: &DemoSummary) -> f64 {
    s.tokens_per_cpu_second()
        .or_else(|| s.tokens_per_second())
        .unwrap_or(0.0)
}

/// One draft length of [`SweepReport`].
#[derive(Clone, Debug)]
pub struct SweepRow {
    /// The draft length.
    pub k: usize,
    /// Measured throughput of each round's run at this `k` (see [`SweepReport::cpu_time`]).
    pub measured: Vec<f64>,
    /// The median of [`measured`](Self::measured).
    pub median: f64,
    /// Mean tokens per step measured at this `k` (emitted tokens / drafts), over all rounds.
    pub tokens_per_step: f64,
    /// The advisor's `E(k)`, from the calibration run.
    pub predicted_tokens: f64,
    /// The advisor's `S(k)`, from the calibration run.
    pub predicted_speedup: f64,
    /// Predicted throughput: the calibration run's measured throughput scaled by
    /// `S(k) / S(k_calibration)`.
    pub predicted: f64,
}

/// What `specula demo --sweep-k` measured: a calibration run at `k = MAX_K` whose advice predicts
/// every `k` from that single run, then the demo at every `k` (several rounds).
#[derive(Clone, Debug)]
pub struct SweepReport {
    /// The calibration run's measured throughput.
    pub calibration: f64,
    /// The calibration run's cost model (its draft cost ratio `r` and rejection saving `s`).
    pub cost: CostModel,
    /// The advised draft length.
    pub recommended: usize,
    /// One row per `k = 1..=MAX_K`.
    pub rows: Vec<SweepRow>,
    /// Whether every throughput is per CPU second of the decode thread (else per wall second).
    pub cpu_time: bool,
}

/// The advised `k`'s measured throughput may be at most this far below the best measured one.
pub const SWEEP_TOLERANCE: f64 = 0.05;

/// The most rounds [`sweep_k`] runs (each round is `MAX_K` runs).
pub const MAX_SWEEP_ROUNDS: usize = 20;

impl SweepReport {
    /// The `k` with the best median measured throughput.
    pub fn best_measured(&self) -> usize {
        let mut best = &self.rows[0];
        for r in &self.rows {
            if r.median > best.median {
                best = r;
            }
        }
        best.k
    }

    /// The advised `k`'s median measured throughput over the best one's.
    pub fn ratio(&self) -> f64 {
        let at = |k: usize| {
            self.rows
                .iter()
                .find(|r| r.k == k)
                .map_or(0.0, |r| r.median)
        };
        let best = at(self.best_measured());
        if best > 0.0 {
            at(self.recommended) / best
        } else {
            0.0
        }
    }

    /// The advised `k` is within [`SWEEP_TOLERANCE`] of the best measured throughput.
    pub fn passed(&self) -> bool {
        self.ratio() >= 1.0 - SWEEP_TOLERANCE
    }
}

impl std::fmt::Display for SweepReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unit = if self.cpu_time {
            "tokens/s (CPU)"
        } else {
            "tokens/s (wall)"
        };
        writeln!(
            f,
            "== specula demo --sweep-k ==\ncalibration run at k={MAX_K}: {:.0} {unit}, draft cost \
             ratio {:.4}, rejection saving {:.4}, advice k={}",
            self.calibration,
            self.cost.per_draft(),
            self.cost.rejection_saving(),
            self.recommended
        )?;
        writeln!(
            f,
            " k  measured (median)  predicted  pred/meas  speedup  E(k) pred  E(k) meas  rounds"
        )?;
        for r in &self.rows {
            let rounds: Vec<String> = r.measured.iter().map(|m| format!("{m:.0}")).collect();
            writeln!(
                f,
                "{:>2}  {:>17.0}  {:>9.0}  {:>9.3}  {:>6.3}x  {:>9.3}  {:>9.3}  {}",
                r.k,
                r.median,
                r.predicted,
                r.predicted / r.median,
                r.predicted_speedup,
                r.predicted_tokens,
                r.tokens_per_step,
                rounds.join(" ")
            )?;
        }
        let best = self.best_measured();
        write!(
            f,
            "advised k={}: {:.3} of the best measured throughput (k={best}); within {:.0} %: {}\n\
             SWEEP recommended={} best={best} ratio={:.4} pass={}",
            self.recommended,
            self.ratio(),
            SWEEP_TOLERANCE * 100.0,
            if self.passed() { "PASS" } else { "FAIL" },
            self.recommended,
            self.ratio(),
            self.passed()
        )
    }
}

/// The median of `v` (the mean of the middle two for an even count); 0 for none.
fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// `specula demo --sweep-k`: one calibration run at `k = MAX_K`, whose advice (from its
/// counters and step timings alone) predicts the throughput of every `k`, then `rounds` rounds
/// of runs at `k = 1..=MAX_K` (interleaved, so a change of machine load spreads over every
/// `k`), each with `cfg` but its `k`. `run` runs the demo once (the program opens a fresh
/// backend per run).
///
/// # Errors
/// A run's error; [`DemoError::Config`] for a tree shape, rounds outside
/// `1..=`[`MAX_SWEEP_ROUNDS`] or a calibration run that gives no advice;
/// [`DemoError::Stopped`] when [`DemoConfig::shutdown`] is requested during the series.
pub fn sweep_k(
    cfg: &DemoConfig,
    rounds: usize,
    mut run: impl FnMut(&DemoConfig) -> Result<DemoSummary, DemoError>,
) -> Result<SweepReport, DemoError> {
    if cfg.tree.is_some() || !(1..=MAX_SWEEP_ROUNDS).contains(&rounds) {
        return Err(DemoError::Config(format!(
            "--sweep-k runs chains, 1..={MAX_SWEEP_ROUNDS} rounds"
        )));
    }
    let with_k = |k: usize| DemoConfig { k, ..cfg.clone() };
    let mut run = |c: &DemoConfig| {
        let summary = run(c)?;
        match cfg.shutdown.reason() {
            Some(r) => Err(DemoError::Stopped(r)),
            None => Ok(summary),
        }
    };
    let calibration = run(&with_k(MAX_K))?;
    let advice = calibration
        .advice()
        .map_err(|e| DemoError::Config(format!("the calibration run gives no advice: {e}")))?;
    let cost = calibration
        .costs
        .cost_model()
        .map_err(|e| DemoError::Config(e.to_string()))?;
    let mut runs: Vec<Vec<DemoSummary>> = vec![Vec::new(); MAX_K];
    for _ in 0..rounds {
        for (i, r) in runs.iter_mut().enumerate() {
            r.push(run(&with_k(i + 1))?);
        }
    }
    let measured_at = sweep_throughput(&calibration);
    let s_cal = advice.expected_speedup(MAX_K).unwrap_or(1.0);
    let cpu_time = std::iter::once(&calibration)
        .chain(runs.iter().flatten())
        .all(|s| s.cpu.is_some());
    let rows = runs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let k = i + 1;
            let measured: Vec<f64> = r.iter().map(sweep_throughput).collect();
            let (emitted, drafts) = r.iter().fold((0u64, 0u64), |(e, d), s| {
                (e + s.totals.emitted_tokens, d + s.totals.drafts)
            });
            let predicted_speedup = advice.expected_speedup(k).unwrap_or(0.0);
            SweepRow {
                k,
                median: median(&measured),
                measured,
                tokens_per_step: emitted as f64 / drafts.max(1) as f64,
                predicted_tokens: advice.expected_tokens(k).unwrap_or(0.0),
                predicted_speedup,
                predicted: measured_at * predicted_speedup / s_cal,
            }
        })
        .collect();
    Ok(SweepReport {
        calibration: measured_at,
        cost,
        recommended: advice.recommended(),
        rows,
        cpu_time,
    })
}

#[cfg(test)]
mod tests;
