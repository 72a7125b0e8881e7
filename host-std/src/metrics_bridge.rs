//! Bridge to the `metrics` facade: increments `metrics::counter!`s by cursor deltas.
//!
//! `metrics` counters are increment-only handles, so the bridge feeds them the exact delta
//! each [`Cursor`] take yields: the sum of increments equals the slot's totals, whatever the
//! schedule (never the totals themselves, which would count everything again at each update).

use crate::clock::StdClock;
use crate::wiring::Slots;
use specula_core::{Clock, Counters, Cursor};
use std::sync::Arc;
use std::time::SystemTime;

/// Feeds every slot's counts to the `metrics` recorder installed by the application.
///
/// Counter names match the Prometheus collector's (`specula_*_total`), labelled `engine` (and
/// `position` for per-position counts). Call [`update`](Self::update) on any schedule, and once
/// more after the collectors' final flush. Given the collectors' clock
/// ([`with_clock`](Self::with_clock)), each update also sets the gauges
/// `specula_last_collection_timestamp_seconds` and `specula_last_collection_age_seconds`, as
/// the Prometheus collector exports them.
pub struct MetricsBridge<const K: usize> {
    cursors: Vec<(Arc<str>, Cursor<'static, K>)>,
    clock: Option<StdClock>,
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
        }
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
            if let Some(t) = cursor.take() {
                n += 1;
                emit(label, &t.delta, t.new_readback_errors);
            }
            if let Some((now_ns, now)) = now {
                let at_ns = cursor.seen().at_ns;
                let engine = label.to_string();
                metrics::gauge!("specula_last_collection_timestamp_seconds", "engine" => engine.clone())
                    .set(crate::prom::unix_seconds(at_ns, now_ns, now));
                metrics::gauge!("specula_last_collection_age_seconds", "engine" => engine)
                    .set(crate::prom::age(at_ns, now_ns).as_secs_f64());
            }
        }
        n
    }
}

fn emit<const K: usize>(label: &Arc<str>, d: &Counters<K>, errors: u64) {
    let engine = label.to_string();
    metrics::counter!("specula_drafts_total", "engine" => engine.clone()).increment(d.drafts);
    metrics::counter!("specula_draft_tokens_total", "engine" => engine.clone())
        .increment(d.draft_tokens);
    metrics::counter!("specula_accepted_tokens_total", "engine" => engine.clone())
        .increment(d.accepted_tokens);
    metrics::counter!("specula_emitted_tokens_total", "engine" => engine.clone())
        .increment(d.emitted_tokens);
    metrics::counter!("specula_readback_errors_total", "engine" => engine.clone())
        .increment(errors);
    for i in 0..K {
        let pos = i.to_string();
        metrics::counter!(
            "specula_accepted_tokens_per_position_total",
            "engine" => engine.clone(), "position" => pos.clone()
        )
        .increment(d.accepted_per_position[i]);
        metrics::counter!(
            "specula_draft_tokens_per_position_total",
            "engine" => engine.clone(), "position" => pos
        )
        .increment(d.drafted_per_position[i]);
    }
}
