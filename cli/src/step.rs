//! What one decode step of the demo needs, below the live loop (`demo`) and the tree drafter
//! (`tree_demo`), which both build on it: the models, the requests, the step trait and the
//! error, so that neither of those two imports the other's half.

use crate::ngram::{NgramError, NgramModel, SplitMix64};
use specula::http::ServeError;
use specula::log_sink::LogThreadPanicked;
use specula::prom::LabelError;
use specula::shutdown::Reason;
use specula::specula_core::RequestAcceptance;
use specula::wiring::WireError;

/// The compile-time maximum draft length of the demo's counters.
pub const MAX_K: usize = 8;

/// Why the demo stopped with an error.
#[derive(Debug)]
#[non_exhaustive]
pub enum DemoError {
    /// A setting is out of range.
    Config(String),
    /// The corpus cannot train the models.
    Corpus(NgramError),
    /// The engine label is not usable.
    Label(WireError),
    /// A constant label (`model_name` or another) is not usable.
    ConstLabel(LabelError),
    /// The metrics server did not start.
    Serve(ServeError),
    /// The verifier refused a batch (a bug: the demo builds valid batches).
    Verify(String),
    /// A sink thread could not start.
    Thread(std::io::Error),
    /// The final counter readback failed (the backend's [`Readback::flush`]); the summary was
    /// still produced, from the last good snapshot.
    Readback(String),
    /// The log thread panicked (its logger did); the summary was still produced.
    LogThread(LogThreadPanicked),
    /// A series of runs (`demo::sweep_k`) was stopped before its end (`DemoConfig::shutdown`).
    Stopped(Reason),
}

impl std::fmt::Display for DemoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Config(m) => write!(f, "invalid setting: {m}"),
            Self::Corpus(e) => write!(f, "cannot train the models on this corpus: {e}"),
            Self::Label(e) => write!(f, "bad engine label: {e}"),
            Self::ConstLabel(e) => write!(f, "bad label: {e}"),
            Self::Serve(e) => e.fmt(f),
            Self::Verify(e) => write!(f, "verification failed: {e}"),
            Self::Thread(e) => write!(f, "cannot start the log thread: {e}"),
            Self::Readback(e) => write!(f, "final counter readback failed: {e}"),
            Self::LogThread(e) => e.fmt(f),
            Self::Stopped(r) => write!(f, "stopped by {r} before the series of runs finished"),
        }
    }
}

impl std::error::Error for DemoError {}

/// Checks an n-gram order before any training.
pub(crate) fn check_order(order: usize) -> Result<(), DemoError> {
    if (1..=crate::ngram::MAX_ORDER).contains(&order) {
        Ok(())
    } else {
        Err(DemoError::Corpus(NgramError::BadOrder(order)))
    }
}

/// One request of the demo: its prompt, then every token it emitted, and its acceptance (an
/// engine keeps this with its request state).
pub(crate) struct Request {
    pub(crate) history: Vec<u32>,
    /// Fed with each step's accepted count.
    pub(crate) acceptance: RequestAcceptance,
    /// Tokens emitted since the request started.
    pub(crate) emitted: u64,
}

/// The demo's two n-gram models over one vocabulary.
pub(crate) struct Models {
    pub(crate) target: NgramModel,
    pub(crate) draft: NgramModel,
    /// Vocabulary size.
    pub(crate) vocab: usize,
    /// History tokens either model reads.
    pub(crate) keep: usize,
}

/// One decode step of the demo loop: drafts for every request from its history, verifies the
/// batch (the verifier counts it), and leaves each request's new tokens. Chains and token
/// trees are two of these; the loop around them (collector, log line, `/metrics`) is one.
pub(crate) trait Step {
    /// Drafts and verifies one step at the requests' stream `offsets`.
    fn step(
        &mut self,
        models: &Models,
        requests: &[Request],
        offsets: &[u64],
        rng: &mut SplitMix64,
    ) -> Result<(), DemoError>;
    /// Request `r`'s tokens from the last step: the accepted ones, then the emitted one.
    fn emitted(&self, r: usize) -> &[u32];
    /// Draft tokens per request per step (a chain's `k`, a tree's depth).
    fn draft_len(&self) -> usize;
    /// What [`scaled_ns`](Self::scaled_ns) grows with: a chain's `k`, a tree's node count.
    fn draft_units(&self) -> usize {
        self.draft_len()
    }
    /// The part of the last step's time (ns) that grows with its draft length, for the
    /// advice's cost model ([`CostMeter::record`]); `None` where the step does not time it.
    fn scaled_ns(&self) -> Option<u64> {
        None
    }
}

/// The request streams' seeds (one per request, from the demo's seed).
pub(crate) fn stream_seeds(seed: u64, b: usize) -> Vec<u64> {
    (0..b as u64)
        .map(|i| seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect()
}
