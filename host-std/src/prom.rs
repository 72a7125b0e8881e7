//! Prometheus: a `prometheus-client` [`Collector`] that reads the slots at scrape time.
//!
//! No timer runs on this path: each scrape reads every slot once (a consistent snapshot per
//! rank) and encodes its cumulative totals as counters. Because the values are the slot's own
//! totals, a scrape can never double count, whatever the scrape and collection schedules.
//!
//! # The acceptance-length distribution: a counter per length, not a native histogram
//! `specula_drafts_by_accepted_length_total{length="j"}` counts the drafts that accepted exactly
//! `j` tokens, one counter per `j` in `0..=draft_len`, derived at scrape time from the
//! per-position counters (exact: see `specula_core::metrics::AcceptanceLengths`). A counter per length rather
//! than a histogram because the values are small integers, each a count in its own right:
//! `rate()` of one series is the share of steps at that length, a bar per length is the
//! distribution AIPerf and vLLM's per-position panels show, and nothing is interpolated. A
//! native histogram's exponential buckets do not fall on the integers (3 and 4 share a bucket
//! at schema 0, and every finer schema interpolates quantiles between lengths that cannot
//! occur), and native histograms travel only in the protobuf exposition, which this exporter's
//! text formats (and `promtool check metrics`) do not carry. A classic histogram with buckets
//! `le="0"`, `"1"`, … would hold the same counts cumulatively, but its `histogram_quantile`
//! interpolates inside a bucket (a median of 2.4 accepted tokens) and every dashboard would
//! need differences of adjacent buckets to show a length's share.
//!
//! # Derived gauges, over a window and the lifetime
//! Conditional acceptance per position and the draft-length advice are ratios, not counts, and
//! a ratio of interval counts cannot be rebuilt from `rate()`s of the exported families for
//! mixed draft lengths, nor an argmax in PromQL: they are gauges computed at scrape time, with
//! `window="recent"` (a sliding window of [`SpecCollector::with_advice_window`], 60 s by
//! default: from one to two window lengths before the scrape; one window per engine, shared by
//! every scraper, so a second Prometheus does not shorten it) and
//! `window="lifetime"` (the totals).

use crate::advice::{CostReading, Sources, Window};
use crate::clock::StdClock;
// The formats live below this module and `http`, which both need them.
pub use crate::exposition::{Format, render};
use crate::wiring::Slots;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use specula_core::metrics::CostModel;
use specula_core::metrics::RATE_BOUNDS_PERCENT;
use specula_core::metrics::{Advice, AdviceError, advise};
use specula_core::{Clock, Counters, FinishedRequests, Snapshot};
use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What the collector exports besides its own `specula_*` families.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Also export the `vllm:spec_decode_*` names existing dashboards use (vLLM v1's counters
    /// and v0's emitted-tokens counter and gauges), and label every family's `engine` with the
    /// slot's index in wiring order ("0", "1", …), as vLLM numbers its engines.
    pub vllm_compat: bool,
}

/// Label names a constant label may not use: the exporter sets `engine`, `position`, `le`,
/// `version`, `max_draft`, `length`, `draft_length` and `window` itself, `quantile` belongs
/// to summaries, and Prometheus adds `job` and `instance` at scrape time (an exported one
/// would be renamed `exported_job`, breaking every dashboard that filters on it).
pub const RESERVED_LABELS: [&str; 11] = [
    "engine",
    "position",
    "le",
    "quantile",
    "job",
    "instance",
    "version",
    "max_draft",
    "length",
    "draft_length",
    "window",
];

/// The default length of the window of the derived gauges (60 s; see
/// [`SpecCollector::with_advice_window`]).
pub const DEFAULT_ADVICE_WINDOW: Duration = Duration::from_secs(60);

/// Longest constant label value, in bytes.
pub const MAX_LABEL_VALUE: usize = 256;

/// Why a constant label was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LabelError {
    /// The name does not match Prometheus' `[a-zA-Z_][a-zA-Z0-9_]*`, or starts with `__`
    /// (reserved for Prometheus' internal use).
    BadName(String),
    /// The name is one the exporter or Prometheus sets itself ([`RESERVED_LABELS`]).
    Reserved(String),
    /// The name was given twice.
    Duplicate(String),
    /// The value of this label is empty, longer than [`MAX_LABEL_VALUE`] bytes or holds a
    /// control character.
    BadValue(String),
    /// A `name=value` pair without `=`.
    NoEquals(String),
}

impl fmt::Display for LabelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadName(n) => write!(
                f,
                "label name {n:?} must match [a-zA-Z_][a-zA-Z0-9_]* and not start with \"__\""
            ),
            Self::Reserved(n) => write!(
                f,
                "label name {n:?} is set by the exporter or by Prometheus (reserved: {})",
                RESERVED_LABELS.join(", ")
            ),
            Self::Duplicate(n) => write!(f, "label {n:?} is given twice"),
            Self::BadValue(n) => write!(
                f,
                "the value of label {n:?} must be 1 to {MAX_LABEL_VALUE} bytes without control \
                 characters"
            ),
            Self::NoEquals(p) => write!(f, "{p:?} is not a name=value pair"),
        }
    }
}

impl std::error::Error for LabelError {}

/// Checks `name` against Prometheus' label name rules and [`RESERVED_LABELS`].
///
/// # Errors
/// [`LabelError::BadName`] or [`LabelError::Reserved`].
pub fn check_label_name(name: &str) -> Result<(), LabelError> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') || name.starts_with("__")
    {
        return Err(LabelError::BadName(name.to_owned()));
    }
    if RESERVED_LABELS.contains(&name) {
        return Err(LabelError::Reserved(name.to_owned()));
    }
    Ok(())
}

/// Labels added to every series the exporters write: `model_name` and whatever key/value
/// pairs the runtime adds (a deployment, a region), validated when added.
///
/// ```
/// use specula::prom::{ConstLabels, LabelError};
/// let labels = ConstLabels::model_name("llama-3-8b")?.with("region", "eu-west")?;
/// assert_eq!(labels.get("model_name"), Some("llama-3-8b"));
/// assert!(matches!(labels.clone().with("engine", "x"), Err(LabelError::Reserved(_))));
/// assert!(matches!(labels.with("2fast", "x"), Err(LabelError::BadName(_))));
/// # Ok::<(), LabelError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConstLabels {
    pairs: Vec<(String, String)>,
}

impl ConstLabels {
    /// No labels.
    pub fn new() -> Self {
        Self::default()
    }

    /// `model_name="name"`, the label vLLM sets on every series (its served model name).
    ///
    /// # Errors
    /// An empty, overlong or control-character value.
    pub fn model_name(name: &str) -> Result<Self, LabelError> {
        Self::new().with("model_name", name)
    }

    /// Adds `name="value"`.
    ///
    /// # Errors
    /// A name that breaks Prometheus' rules or is reserved, a name already given, a bad value.
    pub fn with(mut self, name: &str, value: &str) -> Result<Self, LabelError> {
        self.push(name, value)?;
        Ok(self)
    }

    /// Adds `name="value"` in place; see [`with`](Self::with).
    ///
    /// # Errors
    /// As [`with`](Self::with); nothing is added on error.
    pub fn push(&mut self, name: &str, value: &str) -> Result<(), LabelError> {
        check_label_name(name)?;
        if self.get(name).is_some() {
            return Err(LabelError::Duplicate(name.to_owned()));
        }
        if value.is_empty() || value.len() > MAX_LABEL_VALUE || value.chars().any(char::is_control)
        {
            return Err(LabelError::BadValue(name.to_owned()));
        }
        self.pairs.push((name.to_owned(), value.to_owned()));
        Ok(())
    }

    /// Adds a `name=value` pair (the value may contain `=`), as a command line gives it.
    ///
    /// # Errors
    /// [`LabelError::NoEquals`], or as [`with`](Self::with).
    pub fn push_pair(&mut self, pair: &str) -> Result<(), LabelError> {
        let (name, value) = pair
            .split_once('=')
            .ok_or_else(|| LabelError::NoEquals(pair.to_owned()))?;
        self.push(name, value)
    }

    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// `(name, value)` pairs in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// Number of labels.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// True if there are none.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }
}

/// A draft length outside `1..=K` was asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftLenError {
    /// The length asked for.
    pub got: usize,
    /// The compile-time maximum `K`.
    pub max: usize,
}

impl fmt::Display for DraftLenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "draft length must be 1..={}, got {}", self.max, self.got)
    }
}

impl std::error::Error for DraftLenError {}

/// Checks a runtime draft length against `K`.
///
/// # Errors
/// `n` is 0 or more than `K`.
pub fn check_draft_len<const K: usize>(n: usize) -> Result<usize, DraftLenError> {
    if (1..=K).contains(&n) {
        Ok(n)
    } else {
        Err(DraftLenError { got: n, max: K })
    }
}

/// Reads [`Slots`] at scrape time and encodes them as Prometheus counters.
///
/// Families (each with the constant labels ([`with_labels`](SpecCollector::with_labels)) and
/// an `engine` label, the slot's label):
/// `specula_drafts_total`, `specula_draft_tokens_total`, `specula_accepted_tokens_total`,
/// `specula_emitted_tokens_total`, `specula_accepted_tokens_per_position_total{position}`,
/// `specula_draft_tokens_per_position_total{position}`, `specula_tree_drafts_total` and
/// `specula_tree_draft_tokens_total` (token trees: a tree is also counted in the chain families
/// as a draft of its depth, so the per-position families are per-depth for trees),
/// `specula_readback_errors_total`; and
/// `specula_build_info{version,max_draft}` = 1. Per-position families have one series per
/// position of the runtime's draft length ([`with_draft_len`](SpecCollector::with_draft_len),
/// `K` by default). Given the collectors' clock
/// ([`with_clock`](SpecCollector::with_clock)) also the gauges
/// `specula_last_collection_timestamp_seconds` (Unix time of the last successful collection,
/// the snapshot's `at_ns`) and `specula_last_collection_age_seconds` (how old the data is at
/// the scrape), so a stalled collection shows as an age that grows.
///
/// Derived at scrape time from the same snapshot (nothing is added to the step path):
/// `specula_drafts_by_accepted_length_total{length}` (drafts that accepted exactly `length`
/// tokens, `0..=draft_len`; the last series counts `draft_len` or more, so the series always
/// sum to `specula_drafts_total`) and the gauge
/// `specula_conditional_acceptance_rate{position,window}` (accepted at the position given
/// reached and drafted; see the module documentation for `window`). With a cost source for the
/// engine ([`with_sources`](SpecCollector::with_sources)), the draft-length advice:
/// `specula_recommended_draft_length{window}`, `specula_expected_speedup{draft_length,window}`
/// and `specula_expected_tokens_per_step{draft_length,window}` for every measured draft length,
/// `specula_draft_cost_ratio{window}` (a draft token's cost in plain target steps) and
/// `specula_rejection_saving_ratio{window}` (what a rejected step costs less than one accepted
/// whole, in plain target steps). With a
/// finished-request histogram for the engine: the histogram
/// `specula_request_acceptance_rate` (buckets at `RATE_BOUNDS_PERCENT` / 100) and the
/// counters `specula_requests_finished_total`, `specula_requests_low_acceptance_total` and
/// `specula_requests_high_acceptance_total` (the extremes).
///
/// With [`Options::vllm_compat`] every family's `engine` label is the slot's index in wiring
/// order ("0", "1", …, vLLM's engine index) and these families are added, with vLLM's names,
/// types and help texts: v1's counters `vllm:spec_decode_num_drafts_total`,
/// `vllm:spec_decode_num_draft_tokens_total`, `vllm:spec_decode_num_accepted_tokens_total`,
/// `vllm:spec_decode_num_accepted_tokens_per_pos_total{position}`; v0's counter
/// `vllm:spec_decode_num_emitted_tokens_total` and gauges
/// `vllm:spec_decode_draft_acceptance_rate` (accepted / draft tokens) and
/// `vllm:spec_decode_efficiency` (emitted tokens / (draft tokens + drafts)), computed from the
/// cumulative counts at each scrape (NaN before the first draft, as vLLM's).
#[derive(Debug)]
pub struct SpecCollector<const K: usize> {
    slots: Slots<K>,
    options: Options,
    clock: Option<StdClock>,
    labels: ConstLabels,
    draft_len: usize,
    sources: Sources,
    /// One per slot, in wiring order: the derived gauges' sliding window.
    windows: Mutex<Vec<Window<K>>>,
}

impl<const K: usize> SpecCollector<K> {
    /// A collector over `slots`.
    pub fn new(slots: Slots<K>, options: Options) -> Self {
        let windows = Mutex::new(Self::fresh_windows(&slots, DEFAULT_ADVICE_WINDOW));
        Self {
            slots,
            options,
            clock: None,
            labels: ConstLabels::new(),
            draft_len: K,
            sources: Sources::new(),
            windows,
        }
    }

    fn fresh_windows(slots: &Slots<K>, length: Duration) -> Vec<Window<K>> {
        let ns = crate::clock::duration_ns(length);
        (0..slots.len()).map(|_| Window::new(ns)).collect()
    }

    /// The engines' cost sources (for the advice) and finished-request histograms, by slot
    /// label.
    #[must_use]
    pub fn with_sources(mut self, sources: Sources) -> Self {
        self.sources = sources;
        self
    }

    /// The length of the sliding window of the `window="recent"` gauges (default
    /// [`DEFAULT_ADVICE_WINDOW`], 60 s; at least 1 ns): they cover from one to two lengths
    /// before the scrape, by the snapshots' own collection times; every scraper shares the
    /// window.
    #[must_use]
    pub fn with_advice_window(self, length: Duration) -> Self {
        let windows = Mutex::new(Self::fresh_windows(&self.slots, length));
        Self { windows, ..self }
    }

    /// Exports the time of each slot's last successful collection and its age, reading the
    /// snapshots' `at_ns` on `clock` — the clock the collectors tick with (a [`StdClock`] is
    /// `Copy` and every copy shares its epoch).
    #[must_use]
    pub fn with_clock(mut self, clock: StdClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Adds `labels` to every series (before `engine`).
    #[must_use]
    pub fn with_labels(mut self, labels: ConstLabels) -> Self {
        self.labels = labels;
        self
    }

    /// Exports `n` positions per per-position family: the runtime's draft length
    /// (vLLM's `num_speculative_tokens`), set at start-up; `K` by default.
    ///
    /// # Errors
    /// `n` is 0 or more than `K`.
    pub fn with_draft_len(mut self, n: usize) -> Result<Self, DraftLenError> {
        self.draft_len = check_draft_len::<K>(n)?;
        Ok(self)
    }

    /// A new registry holding only this collector.
    pub fn into_registry(self) -> Registry {
        let mut r = Registry::default();
        r.register_collector(Box::new(self));
        r
    }
}

/// Position label values "0", "1", … (one small string each per scrape).
fn position_labels(n: usize) -> Vec<String> {
    (0..n).map(|i| i.to_string()).collect()
}

/// The label set of one series: the constant labels, then `engine`, then `extra`.
fn label_set<'a>(
    labels: &'a ConstLabels,
    engine: &'a str,
    extra: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut v: Vec<(&str, &str)> = labels.iter().collect();
    v.push(("engine", engine));
    v.extend_from_slice(extra);
    v
}

/// `specula_drafts_by_accepted_length_total`'s `n + 1` values (`n ≤ K`): the drafts in `c`
/// that accepted exactly `0, 1, …, n - 1` tokens, then those that accepted `n` or more
/// (`A[n-1]`, all drafts when `n = 0`). The `metrics` bridge feeds the same from its deltas.
pub(crate) fn by_accepted_length<const K: usize>(
    c: &Counters<K>,
    n: usize,
) -> impl Iterator<Item = u64> + '_ {
    let at_least_n = n
        .checked_sub(1)
        .map_or(c.drafts, |i| c.accepted_per_position[i]);
    (0..n)
        .map(|j| c.accepted_exactly(j).unwrap_or(0))
        .chain([at_least_n])
}

fn counter_family(
    enc: &mut DescriptorEncoder<'_>,
    labels: &ConstLabels,
    name: &str,
    help: &str,
    rows: &[(&str, u64)],
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (engine, v) in rows {
        m.encode_family(&label_set(labels, engine, &[]))?
            .encode_counter::<NoLabelSet, _, u64>(v, None)?;
    }
    Ok(())
}

fn gauge_family(
    enc: &mut DescriptorEncoder<'_>,
    labels: &ConstLabels,
    name: &str,
    help: &str,
    rows: &[(&str, f64)],
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (engine, v) in rows {
        m.encode_family(&label_set(labels, engine, &[]))?
            .encode_gauge(v)?;
    }
    Ok(())
}

/// How old a snapshot taken at `at_ns` is at `now_ns` (zero if it is from the future).
pub fn age(at_ns: u64, now_ns: u64) -> Duration {
    Duration::from_nanos(now_ns.saturating_sub(at_ns))
}

/// The Unix time, in seconds, of `at_ns` on a clock that reads `now_ns` at the system time
/// `now` (before the Unix epoch: 0).
pub fn unix_seconds(at_ns: u64, now_ns: u64, now: SystemTime) -> f64 {
    now.checked_sub(age(at_ns, now_ns))
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What a scrape derives per slot besides its snapshot: the counts over the recent window and
/// the advice over it and over the lifetime (with a cost source), the finished-request
/// histogram (with one).
struct Derived<const K: usize> {
    recent: Counters<K>,
    /// (recent, lifetime) advice and cost model; `None` without a cost source.
    advice: Option<[Result<(Advice<K>, CostModel), AdviceError>; 2]>,
    requests: Option<FinishedRequests>,
}

/// The `window` label values of the derived gauges, in the order of [`Derived::advice`] (and
/// of the `metrics` bridge's counts).
pub(crate) const WINDOWS: [&str; 2] = ["recent", "lifetime"];

/// One encoding pass: the snapshots, their engine label values and the settings.
struct Scrape<'a, const K: usize> {
    labels: &'a ConstLabels,
    snaps: Vec<(&'a str, Snapshot<K>)>,
    positions: Vec<String>,
    derived: Vec<Derived<K>>,
}

impl<const K: usize> Scrape<'_, K> {
    /// `specula_drafts_by_accepted_length_total{length}`: `0..=draft_len`, the last one
    /// `draft_len` or more.
    fn length_family(&self, enc: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let n = self.positions.len();
        let lengths = position_labels(n + 1);
        let mut m = enc.encode_descriptor(
            "specula_drafts_by_accepted_length",
            "Drafts that accepted exactly this many draft tokens (the last length: this many or \
             more); derived exactly from the per-position counters.",
            None,
            MetricType::Counter,
        )?;
        for (engine, s) in &self.snaps {
            for (length, v) in lengths.iter().zip(by_accepted_length(&s.counters, n)) {
                m.encode_family(&label_set(
                    self.labels,
                    engine,
                    &[("length", length.as_str())],
                ))?
                .encode_counter::<NoLabelSet, _, u64>(&v, None)?;
            }
        }
        Ok(())
    }

    /// A gauge family with one series per engine, window and `key` value: `series(slot,
    /// window)` gives the `(key value, value)` pairs (none: no series).
    fn windowed_gauges(
        &self,
        enc: &mut DescriptorEncoder<'_>,
        name: &str,
        help: &str,
        key: Option<&str>,
        series: impl Fn(usize, usize) -> Vec<(String, f64)>,
    ) -> Result<(), std::fmt::Error> {
        let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (slot, (engine, _)) in self.snaps.iter().enumerate() {
            for (w, window) in WINDOWS.iter().enumerate() {
                for (value_of_key, v) in series(slot, w) {
                    let mut extra = vec![("window", *window)];
                    if let Some(k) = key {
                        extra.insert(0, (k, value_of_key.as_str()));
                    }
                    m.encode_family(&label_set(self.labels, engine, &extra))?
                        .encode_gauge(&v)?;
                }
            }
        }
        Ok(())
    }

    fn derived_families(&self, enc: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let n = self.positions.len();
        self.windowed_gauges(
            enc,
            "specula_conditional_acceptance_rate",
            "Acceptance at this draft position among drafts that reached it and had a token \
             there (an estimate inside the exact bounds when draft lengths mix).",
            Some("position"),
            |slot, w| {
                let c = if w == 0 {
                    &self.derived[slot].recent
                } else {
                    &self.snaps[slot].1.counters
                };
                (0..n)
                    .filter_map(|i| Some((i.to_string(), c.conditional_acceptance(i)?)))
                    .collect()
            },
        )?;
        let advice = |slot: usize, w: usize| -> Option<&(Advice<K>, CostModel)> {
            self.derived[slot].advice.as_ref()?[w].as_ref().ok()
        };
        self.windowed_gauges(
            enc,
            "specula_recommended_draft_length",
            "The draft length with the largest expected speedup (the advisor's argmax).",
            None,
            |slot, w| {
                advice(slot, w)
                    .map(|(a, _)| (String::new(), a.recommended() as f64))
                    .into_iter()
                    .collect()
            },
        )?;
        self.windowed_gauges(
            enc,
            "specula_expected_speedup",
            "Expected speedup over plain decoding at this draft length: expected tokens per \
             step over the step's cost in plain target steps.",
            Some("draft_length"),
            |slot, w| {
                advice(slot, w)
                    .map(|(a, _)| a.iter().map(|(k, _, s)| (k.to_string(), s)).collect())
                    .unwrap_or_default()
            },
        )?;
        self.windowed_gauges(
            enc,
            "specula_expected_tokens_per_step",
            "Expected tokens emitted per verification step at this draft length.",
            Some("draft_length"),
            |slot, w| {
                advice(slot, w)
                    .map(|(a, _)| a.iter().map(|(k, e, _)| (k.to_string(), e)).collect())
                    .unwrap_or_default()
            },
        )?;
        self.windowed_gauges(
            enc,
            "specula_draft_cost_ratio",
            "What one draft token adds to a step, in plain (non-speculative) target steps.",
            None,
            |slot, w| {
                advice(slot, w)
                    .map(|(_, c)| (String::new(), c.per_draft()))
                    .into_iter()
                    .collect()
            },
        )?;
        self.windowed_gauges(
            enc,
            "specula_rejection_saving_ratio",
            "What a step whose draft is rejected costs less than one accepted whole, in plain \
             target steps (fitted from the step outcomes; 0 when they do not vary).",
            None,
            |slot, w| {
                advice(slot, w)
                    .map(|(_, c)| (String::new(), c.rejection_saving()))
                    .into_iter()
                    .collect()
            },
        )?;
        // The finished-request histogram and its extremes, for engines that keep one.
        let with_requests: Vec<(&str, &FinishedRequests)> = self
            .snaps
            .iter()
            .zip(&self.derived)
            .filter_map(|((engine, _), d)| Some((*engine, d.requests.as_ref()?)))
            .collect();
        if with_requests.is_empty() {
            return Ok(());
        }
        {
            let mut m = enc.encode_descriptor(
                "specula_request_acceptance_rate",
                "Acceptance rate (accepted / drafted tokens) of each finished request that \
                 drafted.",
                None,
                MetricType::Histogram,
            )?;
            for (engine, h) in &with_requests {
                let mut buckets: Vec<(f64, u64)> = RATE_BOUNDS_PERCENT
                    .iter()
                    .zip(h.buckets)
                    .map(|(&p, n)| (f64::from(p) / 100.0, n))
                    .collect();
                buckets.push((f64::INFINITY, 0));
                m.encode_family(&label_set(self.labels, engine, &[]))?
                    .encode_histogram::<NoLabelSet>(
                        h.rate_sum_micros as f64 / 1e6,
                        h.drafted_requests(),
                        &buckets,
                        None,
                    )?;
            }
        }
        let rows = |f: fn(&FinishedRequests) -> u64| -> Vec<(&str, u64)> {
            with_requests.iter().map(|(e, h)| (*e, f(h))).collect()
        };
        counter_family(
            enc,
            self.labels,
            "specula_requests_finished",
            "Requests finished (those that never drafted included).",
            &rows(|h| h.finished),
        )?;
        counter_family(
            enc,
            self.labels,
            "specula_requests_low_acceptance",
            "Finished requests whose draft contributed (nearly) nothing: acceptance at most the \
             runtime's low threshold (default 5 %) over enough draft tokens.",
            &rows(|h| h.low),
        )?;
        counter_family(
            enc,
            self.labels,
            "specula_requests_high_acceptance",
            "Finished requests with (nearly) every draft token accepted over a long output \
             (default 95 % over 256 tokens): possible repetition loops.",
            &rows(|h| h.high),
        )
    }

    fn position_family(
        &self,
        enc: &mut DescriptorEncoder<'_>,
        name: &str,
        help: &str,
        field: impl Fn(&Snapshot<K>) -> &[u64; K],
    ) -> Result<(), std::fmt::Error> {
        let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (engine, s) in &self.snaps {
            for (pos, v) in self.positions.iter().zip(field(s)) {
                m.encode_family(&label_set(
                    self.labels,
                    engine,
                    &[("position", pos.as_str())],
                ))?
                .encode_counter::<NoLabelSet, _, u64>(v, None)?;
            }
        }
        Ok(())
    }
}

impl<const K: usize> SpecCollector<K> {
    /// Moves every slot's window to its snapshot and derives what the gauges need.
    fn derive(&self, snaps: &[(&str, Snapshot<K>)]) -> Vec<Derived<K>> {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        self.slots
            .iter()
            .zip(snaps)
            .zip(windows.iter_mut())
            .map(|(((label, _), (_, s)), window)| {
                let costs: Option<CostReading> = self.sources.costs(label).map(|c| c.read());
                let recent = window.update(s.at_ns, &s.counters, costs);
                let advice = costs.map(|now| {
                    let lifetime = now.since(None).and_then(|c| {
                        let a = advise(&s.counters, &c)?;
                        Ok((a, c))
                    });
                    let windowed = recent.advice.unwrap_or(Err(AdviceError::NoTimings));
                    [windowed, lifetime]
                });
                Derived {
                    recent: recent.counters,
                    advice,
                    requests: self.sources.requests(label).map(|r| r.read().0),
                }
            })
            .collect()
    }
}

impl<const K: usize> Collector for SpecCollector<K> {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        // Engine label values: the slot's label, or in compat mode its index (vLLM's).
        let indices: Vec<String> = if self.options.vllm_compat {
            position_labels(self.slots.len())
        } else {
            Vec::new()
        };
        // One read per slot per scrape: every family below comes from the same snapshot.
        let snaps: Vec<(&str, Snapshot<K>)> = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, (l, r))| {
                let engine = indices.get(i).map_or(&**l, String::as_str);
                (engine, r.read().0)
            })
            .collect();
        let derived = self.derive(&snaps);
        let sc = Scrape {
            labels: &self.labels,
            snaps,
            positions: position_labels(self.draft_len),
            derived,
        };
        let labels = &self.labels;
        let rows = |f: fn(&Snapshot<K>) -> u64| -> Vec<(&str, u64)> {
            sc.snaps.iter().map(|(l, s)| (*l, f(s))).collect()
        };
        let gauges = |f: &dyn Fn(&Snapshot<K>) -> f64| -> Vec<(&str, f64)> {
            sc.snaps.iter().map(|(l, s)| (*l, f(s))).collect()
        };

        let drafts = rows(|s| s.counters.drafts);
        let draft_tokens = rows(|s| s.counters.draft_tokens);
        let accepted = rows(|s| s.counters.accepted_tokens);
        let emitted = rows(|s| s.counters.emitted_tokens);
        counter_family(
            &mut enc,
            labels,
            "specula_drafts",
            "Verification steps with at least one draft token.",
            &drafts,
        )?;
        counter_family(
            &mut enc,
            labels,
            "specula_draft_tokens",
            "Draft tokens proposed.",
            &draft_tokens,
        )?;
        counter_family(
            &mut enc,
            labels,
            "specula_accepted_tokens",
            "Draft tokens accepted by the verifier.",
            &accepted,
        )?;
        counter_family(
            &mut enc,
            labels,
            "specula_emitted_tokens",
            "Tokens emitted: accepted plus one recovered or bonus token per draft.",
            &emitted,
        )?;
        sc.position_family(
            &mut enc,
            "specula_accepted_tokens_per_position",
            "Drafts whose token at this position was accepted.",
            |s| &s.counters.accepted_per_position,
        )?;
        sc.position_family(
            &mut enc,
            "specula_draft_tokens_per_position",
            "Drafts that had a token at this position.",
            |s| &s.counters.drafted_per_position,
        )?;
        sc.length_family(&mut enc)?;
        sc.derived_families(&mut enc)?;
        counter_family(
            &mut enc,
            labels,
            "specula_tree_drafts",
            "Verification steps of a token tree with at least one draft node (also counted in \
             specula_drafts, as a draft of the tree's depth).",
            &rows(|s| s.counters.tree_drafts),
        )?;
        counter_family(
            &mut enc,
            labels,
            "specula_tree_draft_tokens",
            "Draft nodes proposed in token trees, the root excluded (mean tree size = this / \
             specula_tree_drafts).",
            &rows(|s| s.counters.tree_draft_tokens),
        )?;
        counter_family(
            &mut enc,
            labels,
            "specula_readback_errors",
            "Counter readbacks that failed or returned decreasing counts.",
            &rows(|s| s.readback_errors),
        )?;
        if let Some(clock) = self.clock {
            // One reading of both clocks per scrape: every engine's age is against the same now.
            let (now_ns, now) = (clock.now_ns(), SystemTime::now());
            gauge_family(
                &mut enc,
                labels,
                "specula_last_collection_timestamp_seconds",
                "Unix time the counters of the last successful collection are as of.",
                &gauges(&|s| unix_seconds(s.at_ns, now_ns, now)),
            )?;
            gauge_family(
                &mut enc,
                labels,
                "specula_last_collection_age_seconds",
                "Age of the last successful collection at this scrape; grows while collection \
                 is stalled.",
                &gauges(&|s| age(s.at_ns, now_ns).as_secs_f64()),
            )?;
        }
        {
            let k = K.to_string();
            let gauge = ConstGauge::new(1i64);
            let mut m = enc.encode_descriptor(
                "specula_build_info",
                "Specula build: version and maximum draft length; always 1.",
                None,
                gauge.metric_type(),
            )?;
            let mut set: Vec<(&str, &str)> = labels.iter().collect();
            set.push(("version", env!("CARGO_PKG_VERSION")));
            set.push(("max_draft", &k));
            gauge.encode(m.encode_family(&set)?)?;
        }
        if self.options.vllm_compat {
            // vLLM v1 (vllm/v1/spec_decode/metrics.py): names, types and help texts.
            counter_family(
                &mut enc,
                labels,
                "vllm:spec_decode_num_drafts",
                "Number of spec decoding drafts.",
                &drafts,
            )?;
            counter_family(
                &mut enc,
                labels,
                "vllm:spec_decode_num_draft_tokens",
                "Number of draft tokens.",
                &draft_tokens,
            )?;
            counter_family(
                &mut enc,
                labels,
                "vllm:spec_decode_num_accepted_tokens",
                "Number of accepted tokens.",
                &accepted,
            )?;
            sc.position_family(
                &mut enc,
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                |s| &s.counters.accepted_per_position,
            )?;
            // vLLM v0 (vllm/engine/metrics.py): the emitted counter and the two gauges, here
            // from the cumulative counts of this very scrape.
            counter_family(
                &mut enc,
                labels,
                "vllm:spec_decode_num_emitted_tokens",
                "Number of emitted tokens.",
                &emitted,
            )?;
            gauge_family(
                &mut enc,
                labels,
                "vllm:spec_decode_draft_acceptance_rate",
                // vLLM v0's help text, its spelling included: exact, so tools that compare
                // metadata see the same family.
                "Speulative token acceptance rate.",
                &gauges(&|s| s.counters.acceptance_rate().unwrap_or(f64::NAN)),
            )?;
            gauge_family(
                &mut enc,
                labels,
                "vllm:spec_decode_efficiency",
                "Speculative decoding system efficiency.",
                &gauges(&|s| s.counters.system_efficiency().unwrap_or(f64::NAN)),
            )?;
        }
        Ok(())
    }
}

/// vLLM's `vllm:inter_token_latency_seconds` bucket boundaries (its v1 `PrometheusStatLogger`).
pub const VLLM_ITL_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// The engine metrics vLLM's dashboards read besides the speculative-decoding families, for a
/// runtime (or the demo) that is not vLLM but wants those dashboards to work: the gauge
/// `vllm:num_requests_running`, the counter `vllm:generation_tokens_total` and the histogram
/// `vllm:inter_token_latency_seconds` (vLLM's buckets, [`VLLM_ITL_BUCKETS`]), with vLLM's help
/// texts and the labels `model_name` (and any other constant label) and `engine`.
///
/// The handles are cheap clones of shared atomics: update them from the decode loop, register
/// them once.
///
/// ```
/// use specula::prom::{ConstLabels, Format, VllmEngineMetrics, render};
/// let m = VllmEngineMetrics::new(&ConstLabels::model_name("demo")?, 0);
/// let mut registry = specula::prometheus_client::registry::Registry::default();
/// m.register(&mut registry);
/// m.set_running(8);
/// m.add_generation_tokens(40);
/// m.observe_inter_token_latency(0.02, 8);
/// let text = render(&registry, Format::Text)?;
/// assert!(text.contains("vllm:generation_tokens_total{model_name=\"demo\",engine=\"0\"} 40"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct VllmEngineMetrics {
    labels: Vec<(String, String)>,
    running: Gauge,
    generation_tokens: Counter,
    inter_token_latency: Histogram,
}

impl VllmEngineMetrics {
    /// Metrics for engine index `engine` (vLLM's `engine` label), labelled with `labels`.
    pub fn new(labels: &ConstLabels, engine: usize) -> Self {
        let mut l: Vec<(String, String)> = labels
            .iter()
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
            .collect();
        l.push(("engine".into(), engine.to_string()));
        Self {
            labels: l,
            running: Gauge::default(),
            generation_tokens: Counter::default(),
            inter_token_latency: Histogram::new(VLLM_ITL_BUCKETS),
        }
    }

    /// Registers the three families in `registry` (once per registry).
    pub fn register(&self, registry: &mut Registry) {
        // `Registry::register` ends every help text with a '.': these are vLLM's without it.
        let sub = registry.sub_registry_with_labels(
            self.labels
                .iter()
                .map(|(n, v)| (n.clone().into(), v.clone().into())),
        );
        sub.register(
            "vllm:num_requests_running",
            "Number of requests in model execution batches",
            self.running.clone(),
        );
        sub.register(
            "vllm:generation_tokens",
            "Number of generation tokens processed",
            self.generation_tokens.clone(),
        );
        sub.register(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds",
            self.inter_token_latency.clone(),
        );
    }

    /// Sets the number of requests running (in the current batch).
    pub fn set_running(&self, n: i64) {
        self.running.set(n);
    }

    /// Counts `n` more generated (emitted) tokens.
    pub fn add_generation_tokens(&self, n: u64) {
        self.generation_tokens.inc_by(n);
    }

    /// Records an inter-token latency of `seconds` for each of `requests` requests (vLLM
    /// observes once per request per engine step: the time since that request's previous
    /// output). A negative or non-finite value is ignored.
    pub fn observe_inter_token_latency(&self, seconds: f64, requests: usize) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        for _ in 0..requests {
            self.inter_token_latency.observe(seconds);
        }
    }
}
