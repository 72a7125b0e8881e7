//! Bridge to the `metrics` facade: increments `metrics::counter!`s by cursor deltas.
//!
//! `metrics` counters are increment-only handles, so the bridge feeds them the exact delta
//! each [`Cursor`] take yields: the sum of increments equals the slot's totals, whatever the
//! schedule (never the totals themselves, which would count everything again at each update).

use crate::wiring::Slots;
use specula_core::{Counters, Cursor};
use std::sync::Arc;

/// Feeds every slot's counts to the `metrics` recorder installed by the application.
///
/// Counter names match the Prometheus collector's (`specula_*_total`), labelled `engine` (and
/// `position` for per-position counts). Call [`update`](Self::update) on any schedule, and once
/// more after the collectors' final flush.
pub struct MetricsBridge<const K: usize> {
    cursors: Vec<(Arc<str>, Cursor<'static, K>)>,
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
        }
    }

    /// Increments the counters by whatever was published since the previous update; returns
    /// how many slots had something new.
    pub fn update(&mut self) -> usize {
        let mut n = 0;
        for (label, cursor) in &mut self.cursors {
            if let Some(t) = cursor.take() {
                n += 1;
                emit(label, &t.delta, t.new_readback_errors);
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
