//! Bridge to the `metrics` facade: increments `metrics::counter!`s by cursor deltas.
//!
//! `metrics` counters are increment-only handles, so the bridge feeds them the exact delta
//! each [`Cursor`] take yields: the sum of increments equals the slot's totals, whatever the
//! schedule (never the totals themselves, which would count everything again at each update).

use crate::clock::StdClock;
use crate::prom::{ConstLabels, DraftLenError, check_draft_len};
use crate::wiring::Slots;
use metrics::Label;
use specula_core::{Clock, Counters, Cursor};
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
pub struct MetricsBridge<const K: usize> {
    cursors: Vec<(Arc<str>, Cursor<'static, K>)>,
    clock: Option<StdClock>,
    labels: Vec<Label>,
    draft_len: usize,
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
        }
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
        for (label, cursor) in &mut self.cursors {
            let mut base = self.labels.clone();
            base.push(Label::new("engine", label.to_string()));
            if let Some(t) = cursor.take() {
                n += 1;
                emit(&base, self.draft_len, &t.delta, t.new_readback_errors);
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

fn emit<const K: usize>(base: &[Label], draft_len: usize, d: &Counters<K>, errors: u64) {
    let l = || base.to_vec();
    metrics::counter!("specula_drafts_total", l()).increment(d.drafts);
    metrics::counter!("specula_draft_tokens_total", l()).increment(d.draft_tokens);
    metrics::counter!("specula_accepted_tokens_total", l()).increment(d.accepted_tokens);
    metrics::counter!("specula_emitted_tokens_total", l()).increment(d.emitted_tokens);
    metrics::counter!("specula_tree_drafts_total", l()).increment(d.tree_drafts);
    metrics::counter!("specula_tree_draft_tokens_total", l()).increment(d.tree_draft_tokens);
    metrics::counter!("specula_readback_errors_total", l()).increment(errors);
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
