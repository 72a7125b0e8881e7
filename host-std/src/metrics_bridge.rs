//! Bridge to the `metrics` facade: increments `metrics::counter!`s by cursor deltas.
//!
//! `metrics` counters are increment-only handles, so the bridge feeds them the exact delta
//! each [`Cursor`] take yields: the sum of increments equals the slot's totals, whatever the
//! schedule (never the totals themselves, which would count everything again at each update).

use crate::advice::{CostReading, Sources};
use crate::clock::StdClock;
use crate::prom::{ConstLabels, DraftLenError, WINDOWS, check_draft_len};
use crate::wiring::Slots;
use metrics::Label;
use specula_core::metrics::RATE_BOUNDS_PERCENT;
use specula_core::metrics::{CostModel, advise};
use specula_core::{Clock, Counters, Cursor, FinishedRequests};
use std::sync::Arc;
use std::time::SystemTime;

/// Feeds every slot's counts to the `metrics` recorder installed by the application.
///
/// Counter names match the Prometheus collector's (`specula_*_total`), labelled with the
/// constant labels ([`with_labels`](Self::with_labels)), `engine` (and `position` for
/// per-position counts, one per position of the runtime's draft length,
/// [`with_draft_len`](Self::with_draft_len)). Call [`update`](Self::update) on any schedule, and once
/// more after the collectors' final flush. Given the collectors' clock
/// ([`with_clock`](Self::with_clock)), each update also sets the gauges
/// `specula_last_collection_timestamp_seconds` and `specula_last_collection_age_seconds`, as
/// the Prometheus collector exports them.
///
/// The derived families have the Prometheus collector's names: the counters
/// `specula_drafts_by_accepted_length_total{length}` (incremented by each take's exact
/// distribution), and the gauges `specula_conditional_acceptance_rate{position,window}` and,
/// with a cost source ([`with_sources`](Self::with_sources)),
/// `specula_recommended_draft_length{window}`,
/// `specula_expected_speedup{draft_length,window}`,
/// `specula_expected_tokens_per_step{draft_length,window}` and
/// `specula_draft_cost_ratio{window}`, where `window="recent"` is the interval since the
/// previous update that had new counts (the bridge's own interval, with the costs recorded in
/// it) and `window="lifetime"` the totals. With a finished-request histogram, the counters
/// `specula_request_acceptance_rate_bucket{le}` (cumulative, as a Prometheus histogram's),
/// `specula_request_acceptance_rate_count`, `specula_requests_finished_total`,
/// `specula_requests_low_acceptance_total`, `specula_requests_high_acceptance_total`, and the
/// gauge `specula_request_acceptance_rate_sum` (a `metrics` counter holds integers).
pub struct MetricsBridge<const K: usize> {
    cursors: Vec<(Arc<str>, Cursor<'static, K>)>,
    clock: Option<StdClock>,
    labels: Vec<Label>,
    draft_len: usize,
    sources: Sources,
    /// Per slot: the costs at its previous take, and the finished requests last fed.
    seen: Vec<(Option<CostReading>, FinishedRequests)>,
}

impl<const K: usize> std::fmt::Debug for MetricsBridge<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsBridge")
            .field("slots", &self.cursors.len())
            .finish()
    }
}

impl<const K: usize> MetricsBridge<K> {
    /// A bridge over `slots`, starting from zero.
    pub fn new(slots: &Slots<K>) -> Self {
        Self {
            cursors: slots.cursors(),
            clock: None,
            labels: Vec::new(),
            draft_len: K,
            sources: Sources::new(),
            seen: vec![(None, FinishedRequests::ZERO); slots.len()],
        }
    }

    /// The engines' cost sources (for the advice gauges) and finished-request histograms, by
    /// slot label.
    #[must_use]
    pub fn with_sources(mut self, sources: Sources) -> Self {
        self.sources = sources;
        self
    }

    /// Adds `labels` to every counter and gauge (before `engine`).
    #[must_use]
    pub fn with_labels(mut self, labels: &ConstLabels) -> Self {
        self.labels = labels
            .iter()
            .map(|(n, v)| Label::new(n.to_owned(), v.to_owned()))
            .collect();
        self
    }

    /// Feeds `n` positions per per-position counter: the runtime's draft length; `K` by
    /// default.
    ///
    /// # Errors
    /// `n` is 0 or more than `K`.
    pub fn with_draft_len(mut self, n: usize) -> Result<Self, DraftLenError> {
        self.draft_len = check_draft_len::<K>(n)?;
        Ok(self)
    }

    /// Also sets the last-collection time and age gauges at each update, reading snapshot
    /// times on `clock` (the collectors' clock).
    #[must_use]
    pub fn with_clock(mut self, clock: StdClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Increments the counters by whatever was published since the previous update; returns
    /// how many slots had something new. With a clock, sets every slot's time gauges too.
    pub fn update(&mut self) -> usize {
        let mut n = 0;
        let now = self.clock.map(|c| (c.now_ns(), SystemTime::now()));
        for ((label, cursor), seen) in self.cursors.iter_mut().zip(&mut self.seen) {
            let mut base = self.labels.clone();
            base.push(Label::new("engine", label.to_string()));
            if let Some(t) = cursor.take() {
                n += 1;
                emit(&base, self.draft_len, &t.delta, t.new_readback_errors);
                let costs = self.sources.costs(label).map(|c| c.read());
                let models = costs.map(|now| {
                    let recent = now.since(seen.0.as_ref());
                    [recent.ok(), now.since(None).ok()]
                });
                seen.0 = costs;
                derived(
                    &base,
                    self.draft_len,
                    [&t.delta, &t.snapshot.counters],
                    models,
                );
            }
            if let Some(r) = self.sources.requests(label) {
                let now = r.read().0;
                requests(&base, &now.delta_since(&seen.1), &now);
                seen.1 = now;
            }
            if let Some((now_ns, now)) = now {
                let at_ns = cursor.seen().at_ns;
                metrics::gauge!("specula_last_collection_timestamp_seconds", base.clone())
                    .set(crate::prom::unix_seconds(at_ns, now_ns, now));
                metrics::gauge!("specula_last_collection_age_seconds", base)
                    .set(crate::prom::age(at_ns, now_ns).as_secs_f64());
            }
        }
        n
    }
}

/// The conditional-acceptance and advice gauges over `[recent, lifetime]` counts, with their
/// cost models (`None`: no cost source; an inner `None`: no timings yet).
fn derived<const K: usize>(
    base: &[Label],
    draft_len: usize,
    counts: [&Counters<K>; 2],
    models: Option<[Option<CostModel>; 2]>,
) {
    for (w, (c, window)) in counts.into_iter().zip(WINDOWS).enumerate() {
        let with = |extra: &[(&'static str, String)]| {
            let mut v = base.to_vec();
            v.extend(extra.iter().map(|(k, x)| Label::new(*k, x.clone())));
            v.push(Label::new("window", window));
            v
        };
        for i in 0..draft_len.min(K) {
            if let Some(p) = c.conditional_acceptance(i) {
                metrics::gauge!(
                    "specula_conditional_acceptance_rate",
                    with(&[("position", i.to_string())])
                )
                .set(p);
            }
        }
        let Some(Some(cost)) = models.map(|m| m[w]) else {
            continue;
        };
        let Ok(a) = advise(c, &cost) else {
            continue;
        };
        metrics::gauge!("specula_recommended_draft_length", with(&[])).set(a.recommended() as f64);
        metrics::gauge!("specula_draft_cost_ratio", with(&[])).set(cost.per_draft());
        metrics::gauge!("specula_rejection_saving_ratio", with(&[])).set(cost.rejection_saving());
        for (k, e, speedup) in a.iter() {
            let l = with(&[("draft_length", k.to_string())]);
            metrics::gauge!("specula_expected_speedup", l.clone()).set(speedup);
            metrics::gauge!("specula_expected_tokens_per_step", l).set(e);
        }
    }
}

/// The finished-request families: counters by `delta`, the sum gauge from `total`.
fn requests(base: &[Label], delta: &FinishedRequests, total: &FinishedRequests) {
    let l = || base.to_vec();
    for (i, &p) in RATE_BOUNDS_PERCENT.iter().enumerate() {
        let mut v = l();
        v.push(Label::new("le", (f64::from(p) / 100.0).to_string()));
        metrics::counter!("specula_request_acceptance_rate_bucket", v)
            .increment(delta.cumulative(i));
    }
    let mut inf = l();
    inf.push(Label::new("le", "+Inf"));
    metrics::counter!("specula_request_acceptance_rate_bucket", inf)
        .increment(delta.drafted_requests());
    metrics::counter!("specula_request_acceptance_rate_count", l())
        .increment(delta.drafted_requests());
    metrics::gauge!("specula_request_acceptance_rate_sum", l())
        .set(total.rate_sum_micros as f64 / 1e6);
    metrics::counter!("specula_requests_finished_total", l()).increment(delta.finished);
    metrics::counter!("specula_requests_low_acceptance_total", l()).increment(delta.low);
    metrics::counter!("specula_requests_high_acceptance_total", l()).increment(delta.high);
}

fn emit<const K: usize>(base: &[Label], draft_len: usize, d: &Counters<K>, errors: u64) {
    let l = || base.to_vec();
    metrics::counter!("specula_drafts_total", l()).increment(d.drafts);
    metrics::counter!("specula_draft_tokens_total", l()).increment(d.draft_tokens);
    metrics::counter!("specula_accepted_tokens_total", l()).increment(d.accepted_tokens);
    metrics::counter!("specula_emitted_tokens_total", l()).increment(d.emitted_tokens);
    metrics::counter!("specula_tree_drafts_total", l()).increment(d.tree_drafts);
    metrics::counter!("specula_tree_draft_tokens_total", l()).increment(d.tree_draft_tokens);
    metrics::counter!("specula_readback_errors_total", l()).increment(errors);
    // The acceptance-length distribution of the take, exact: 0..n, the last n or more.
    for (j, v) in crate::prom::by_accepted_length(d, draft_len.min(K)).enumerate() {
        let mut l = l();
        l.push(Label::new("length", j.to_string()));
        metrics::counter!("specula_drafts_by_accepted_length_total", l).increment(v);
    }
    for i in 0..draft_len.min(K) {
        let with_pos = || {
            let mut v = l();
            v.push(Label::new("position", i.to_string()));
            v
        };
        metrics::counter!("specula_accepted_tokens_per_position_total", with_pos())
            .increment(d.accepted_per_position[i]);
        metrics::counter!("specula_draft_tokens_per_position_total", with_pos())
            .increment(d.drafted_per_position[i]);
    }
}
