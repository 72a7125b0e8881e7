//! What the exporters need besides the counters to tell operators what to run: each engine's
//! step costs (for the draft-length advice) and its finished requests' acceptance histogram.
//!
//! Both travel like the counters: the engine thread owns the unique writer of a seqlock slot
//! (allocated once per engine at start-up and leaked, as [`wire`](crate::wiring::wire) does), and
//! every consumer — the Prometheus collector, the `metrics` bridge, the log sink — reads it on
//! its own schedule. [`Sources`] names, per engine label, what each consumer may read:
//!
//! ```
//! use specula::advice::{CostSource, Sources, cost_slot, request_slot};
//! use specula::specula_core::{Extremes, RequestAcceptance, StepTiming};
//! let (mut costs, cost_reader) = cost_slot();
//! let (mut finished, finished_reader) = request_slot(Extremes::default());
//! let sources = Sources::new()
//!     .with_costs("rank0", CostSource::Measured(cost_reader))
//!     .with_requests("rank0", finished_reader);
//! // In the decode loop: each step's times, and each request that finishes.
//! // k = 4: 12 µs fixed, 3 µs for the four draft forwards; 8 requests, 5 of them rejected.
//! costs.record(&StepTiming {
//!     draft_len: 4,
//!     fixed_ns: 12_000,
//!     scaled_ns: 3_000,
//!     requests: 8,
//!     rejected: 5,
//! });
//! let mut request = RequestAcceptance::NEW;
//! request.record(4, 2)?;
//! finished.finish(&request);
//! assert_eq!(sources.requests("rank0").unwrap().read().0.finished, 1);
//! # Ok::<(), specula::specula_core::CountError>(())
//! ```
//!
//! The writers publish on every call: a seqlock write of a few words (no lock, no allocation),
//! on the engine's thread, outside the collector's step path and outside any device work.

use specula_core::metrics::{Advice, AdviceError, CostMeter, CostModel, StepTiming, advise};
use specula_core::{
    Counters, Extremes, FinishedRequests, RequestAcceptance, SeqSlot, SlotReader, SlotWriter,
};
use std::sync::Arc;

/// Where an engine's draft-token cost comes from.
#[derive(Clone, Copy, Debug)]
pub enum CostSource {
    /// Configured (say, from an offline profile): `r`, a draft token in plain target steps.
    Fixed(CostModel),
    /// Measured by the engine each step ([`CostWriter::record`]).
    Measured(SlotReader<'static, CostMeter>),
}

/// What a [`CostSource`] says at one reading.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CostReading {
    /// A configured cost model.
    Fixed(CostModel),
    /// The engine's cumulative timings at this reading.
    Meter(CostMeter),
}

impl CostSource {
    /// Reads the source now.
    pub fn read(&self) -> CostReading {
        match self {
            Self::Fixed(m) => CostReading::Fixed(*m),
            Self::Measured(r) => CostReading::Meter(r.read().0),
        }
    }
}

impl CostReading {
    /// The cost model over what was recorded since `earlier` (a consumer's previous reading),
    /// or over everything when nothing was recorded since (or for a configured model).
    ///
    /// # Errors
    /// [`AdviceError::NoTimings`] when nothing was ever recorded.
    pub fn since(&self, earlier: Option<&CostReading>) -> Result<CostModel, AdviceError> {
        match (self, earlier) {
            (Self::Fixed(m), _) => Ok(*m),
            (Self::Meter(now), Some(Self::Meter(then))) => now
                .delta_since(then)
                .cost_model()
                .or_else(|_| now.cost_model()),
            (Self::Meter(now), _) => now.cost_model(),
        }
    }
}

/// The engine's side of a measured [`CostSource`]: it records each step's times and publishes
/// the cumulative [`CostMeter`].
#[derive(Debug)]
pub struct CostWriter {
    meter: CostMeter,
    writer: SlotWriter<'static, CostMeter>,
}

impl CostWriter {
    /// Records one step (see [`StepTiming`] for which part of the step is `fixed_ns` and
    /// which `scaled_ns`, and what its outcome fits) and publishes the totals.
    pub fn record(&mut self, step: &StepTiming) {
        self.meter.record(step);
        self.writer.publish(&self.meter);
    }

    /// The totals recorded so far.
    pub fn meter(&self) -> &CostMeter {
        &self.meter
    }
}

/// A slot for one engine's step timings, for the life of the process (once per engine at
/// start-up): the engine's [`CostWriter`] and the reader every consumer gets.
pub fn cost_slot() -> (CostWriter, SlotReader<'static, CostMeter>) {
    let slot: &'static mut SeqSlot<CostMeter> = Box::leak(Box::new(SeqSlot::new(CostMeter::ZERO)));
    let (writer, reader) = slot.split();
    (
        CostWriter {
            meter: CostMeter::ZERO,
            writer,
        },
        reader,
    )
}

/// The engine's side of the finished-request histogram: it records each request as it finishes
/// (its [`RequestAcceptance`], kept with the request's state) and publishes the totals.
#[derive(Debug)]
pub struct RequestWriter {
    finished: FinishedRequests,
    extremes: Extremes,
    writer: SlotWriter<'static, FinishedRequests>,
}

impl RequestWriter {
    /// Records a finished request and publishes the totals.
    pub fn finish(&mut self, request: &RequestAcceptance) {
        self.finished.record(request, &self.extremes);
        self.writer.publish(&self.finished);
    }

    /// The totals so far.
    pub fn finished(&self) -> &FinishedRequests {
        &self.finished
    }

    /// The thresholds of the extreme counts.
    pub fn extremes(&self) -> &Extremes {
        &self.extremes
    }
}

/// A slot for one engine's finished-request histogram, for the life of the process, with the
/// thresholds of its extreme counts: the engine's [`RequestWriter`] and the consumers' reader.
pub fn request_slot(extremes: Extremes) -> (RequestWriter, SlotReader<'static, FinishedRequests>) {
    let slot: &'static mut SeqSlot<FinishedRequests> =
        Box::leak(Box::new(SeqSlot::new(FinishedRequests::ZERO)));
    let (writer, reader) = slot.split();
    (
        RequestWriter {
            finished: FinishedRequests::ZERO,
            extremes,
            writer,
        },
        reader,
    )
}

#[derive(Clone, Debug)]
struct Entry {
    label: Arc<str>,
    costs: Option<CostSource>,
    requests: Option<SlotReader<'static, FinishedRequests>>,
}

/// Per engine label (the [`Slots`](crate::wiring::Slots)' labels), the cost source and the
/// finished-request histogram the consumers read; cheap to clone. An engine without a cost
/// source gets no advice (its acceptance-length distribution and conditional acceptance are
/// exported all the same); one without a histogram exports none.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    entries: Arc<[Entry]>,
}

impl Sources {
    /// No sources.
    pub fn new() -> Self {
        Self::default()
    }

    fn with(self, label: &str, f: impl FnOnce(&mut Entry)) -> Self {
        let mut entries: Vec<Entry> = self.entries.to_vec();
        let i = match entries.iter().position(|e| &*e.label == label) {
            Some(i) => i,
            None => {
                entries.push(Entry {
                    label: label.into(),
                    costs: None,
                    requests: None,
                });
                entries.len() - 1
            }
        };
        f(&mut entries[i]);
        Self {
            entries: entries.into(),
        }
    }

    /// The cost source of engine `label` (replacing one given before).
    #[must_use]
    pub fn with_costs(self, label: &str, costs: CostSource) -> Self {
        self.with(label, |e| e.costs = Some(costs))
    }

    /// The finished-request histogram of engine `label` (replacing one given before).
    #[must_use]
    pub fn with_requests(self, label: &str, reader: SlotReader<'static, FinishedRequests>) -> Self {
        self.with(label, |e| e.requests = Some(reader))
    }

    /// Engine `label`'s cost source.
    pub fn costs(&self, label: &str) -> Option<CostSource> {
        self.entry(label).and_then(|e| e.costs)
    }

    /// Engine `label`'s finished-request histogram.
    pub fn requests(&self, label: &str) -> Option<SlotReader<'static, FinishedRequests>> {
        self.entry(label).and_then(|e| e.requests)
    }

    fn entry(&self, label: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| &*e.label == label)
    }
}

/// A consumer's running view of one engine over a sliding window: the counts and costs at the
/// start of the current and of the previous window. What it reports runs from the previous
/// window's start to now, between one and two window lengths (everything since zero until one
/// window has passed), so it follows traffic within two windows whatever the reading schedule.
/// The window starts at the snapshot of the reading that found the previous one a window old:
/// the snapshots' collection times decide, not the readers' clocks.
#[derive(Clone, Debug)]
pub struct Window<const K: usize> {
    length_ns: u64,
    /// (at_ns, counters, costs) where the current window started.
    current: Option<(u64, Counters<K>, Option<CostReading>)>,
    /// The same where the previous one started: the reported window's start.
    previous: Option<(u64, Counters<K>, Option<CostReading>)>,
}

/// What a [`Window`] reports: the counts over the window and, with costs, the advice.
#[derive(Clone, Copy, Debug)]
pub struct Windowed<const K: usize> {
    /// Counts over the window.
    pub counters: Counters<K>,
    /// Advice over the window and the cost model it used (`None` without a cost source).
    pub advice: Option<Result<(Advice<K>, CostModel), AdviceError>>,
}

impl<const K: usize> Window<K> {
    /// A window of `length_ns` (at least 1 ns).
    pub fn new(length_ns: u64) -> Self {
        Self {
            length_ns: length_ns.max(1),
            current: None,
            previous: None,
        }
    }

    /// Moves the window to a snapshot of `counters` as of `at_ns` with the costs read now, and
    /// reports the window ending there.
    pub fn update(
        &mut self,
        at_ns: u64,
        counters: &Counters<K>,
        costs: Option<CostReading>,
    ) -> Windowed<K> {
        match self.current {
            None => self.current = Some((at_ns, *counters, costs)),
            Some((start, ..)) if at_ns.saturating_sub(start) >= self.length_ns => {
                self.previous = self.current;
                self.current = Some((at_ns, *counters, costs));
            }
            Some(_) => {}
        }
        let (base, base_costs) = match &self.previous {
            Some((_, c, k)) => (*c, *k),
            None => (Counters::ZERO, None),
        };
        let window = counters.delta_since(&base);
        let advice = costs.map(|now| {
            let cost = now.since(base_costs.as_ref())?;
            Ok((advise(&window, &cost)?, cost))
        });
        Windowed {
            counters: window,
            advice,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_are_read_over_what_was_recorded_since() {
        let (mut w, r) = cost_slot();
        let source = CostSource::Measured(r);
        assert_eq!(source.read().since(None), Err(AdviceError::NoTimings));
        let step = |fixed_ns, scaled_ns| StepTiming {
            draft_len: 2,
            fixed_ns,
            scaled_ns,
            ..StepTiming::default()
        };
        w.record(&step(1_000, 200));
        let first = source.read();
        assert_eq!(first.since(None).unwrap().per_draft(), 0.1);
        w.record(&step(1_000, 2_000));
        let second = source.read();
        // Since the first reading: the second step only (r = 1); from the start: 0.55.
        assert_eq!(second.since(Some(&first)).unwrap().per_draft(), 1.0);
        assert_eq!(second.since(None).unwrap().per_draft(), 0.55);
        // Nothing new since: the totals.
        assert_eq!(second.since(Some(&second)).unwrap().per_draft(), 0.55);
        assert_eq!(w.meter().steps, 2);
        let fixed = CostSource::Fixed(CostModel::from_ratio(0.3).unwrap()).read();
        assert_eq!(fixed.since(Some(&second)).unwrap().per_draft(), 0.3);
    }

    #[test]
    fn finished_requests_are_published_with_the_extremes() {
        let x = Extremes {
            min_drafted: 1,
            ..Extremes::default()
        };
        let (mut w, r) = request_slot(x);
        let mut low = RequestAcceptance::NEW;
        low.record(4, 0).unwrap();
        w.finish(&low);
        w.finish(&RequestAcceptance::NEW);
        let (h, version) = r.read();
        assert_eq!((h.finished, h.undrafted, h.low, version), (2, 1, 1, 2));
        assert_eq!(w.finished(), &h);
        assert_eq!(w.extremes(), &x);
    }

    #[test]
    fn sources_are_found_by_label_and_replaced() {
        let (_, r) = cost_slot();
        let fixed = CostSource::Fixed(CostModel::from_ratio(0.5).unwrap());
        let s = Sources::new()
            .with_costs("a", CostSource::Measured(r))
            .with_costs("b", fixed)
            .with_costs("a", fixed);
        assert!(matches!(s.costs("a"), Some(CostSource::Fixed(_))));
        assert!(s.costs("b").is_some() && s.costs("c").is_none());
        assert!(s.requests("a").is_none());
        let (_, fr) = request_slot(Extremes::default());
        let s = s.with_requests("c", fr);
        assert!(s.requests("c").is_some() && s.costs("c").is_none());
    }

    #[test]
    fn the_window_slides_over_one_to_two_lengths() {
        let mut w = Window::<2>::new(10);
        let mut c = Counters::<2>::ZERO;
        let fixed = Some(CostReading::Fixed(CostModel::from_ratio(0.0).unwrap()));
        c.record(2, 2).unwrap();
        // Before a window has passed: everything since zero.
        let r = w.update(5, &c, fixed);
        assert_eq!(r.counters, c);
        assert_eq!(r.advice.unwrap().unwrap().0.expected_tokens(2), Some(3.0));
        let at_5 = c;
        c.record(2, 0).unwrap();
        // A window has passed at 15: from 5 on.
        assert_eq!(w.update(15, &c, fixed).counters, c.delta_since(&at_5));
        let at_15 = c;
        c.record(2, 0).unwrap();
        assert_eq!(w.update(20, &c, fixed).counters, c.delta_since(&at_5));
        c.record(2, 1).unwrap();
        // The next one has passed at 26: from 15 on.
        assert_eq!(w.update(26, &c, fixed).counters, c.delta_since(&at_15));
        c.record(1, 1).unwrap();
        let r = w.update(30, &c, None);
        assert_eq!(r.counters, c.delta_since(&at_15));
        assert_eq!(r.counters.drafts, 3);
        assert!(r.advice.is_none(), "no cost source, no advice");
        assert_eq!(Window::<2>::new(0).length_ns, 1);
    }
}
