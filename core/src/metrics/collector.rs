//! [`Collector`]: the asynchronous collection state machine, driven once per decode step.

use crate::metrics::Readback;
use crate::metrics::SlotWriter;
use crate::metrics::{Counters, Snapshot};
use crate::metrics::{Flight, MAX_IN_FLIGHT};
use crate::metrics::{Interval, ZeroPeriod};
use core::task::Poll;

/// Readback latencies remembered for the latency estimate (the largest of them is used).
pub const LATENCY_WINDOW: usize = 16;

/// Readback latencies measured before the deadline planner trusts their spread; until then a
/// readback starts every half deadline period.
pub const CALIBRATION: usize = 4;

/// Step gaps remembered for the step-gap estimate (the largest of them is used): a maximum
/// that forgets a pause in the steps (an idle engine) within as many steps.
pub const GAP_WINDOW: usize = 16;

/// The smallest default staleness deadline: 1 s (a few periods of a sub-second collection
/// period would declare healthy GPU readbacks stale).
pub const MIN_STALE_NS: u64 = 1_000_000_000;

/// The default staleness deadline, in collection periods.
pub const DEFAULT_STALE_PERIODS: u64 = 3;

/// What one [`Collector::tick`] did: the most telling of what happened, in the order
/// `Published`, `Failed`, `Started`, `Pending`, `Idle`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Tick {
    /// Nothing due and nothing in flight.
    #[default]
    Idle,
    /// A readback was started.
    Started,
    /// A readback is in flight and not finished.
    Pending,
    /// A readback finished and was published as this version (the last one, if several
    /// finished in this tick).
    Published(u64),
    /// A readback failed or went stale; the last good counters were republished with the
    /// error count raised.
    Failed,
}

/// Why a readback was not published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum CollectError<E> {
    /// The backend reported an error.
    Readback(E),
    /// The backend returned counts below ones already published (a broken backend, or counters
    /// reset behind the collector's back); they are discarded.
    NotMonotonic,
    /// A readback was in flight for longer than the staleness deadline.
    Stale,
}

impl<E: core::fmt::Debug> core::fmt::Display for CollectError<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Readback(e) => write!(f, "counter readback failed: {e:?}"),
            Self::NotMonotonic => f.write_str("readback returned decreasing counters"),
            Self::Stale => f.write_str("counter readback did not complete before its deadline"),
        }
    }
}

impl<E: core::fmt::Debug> core::error::Error for CollectError<E> {}

/// One readback in flight.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Entry {
    /// Clock time of the tick that started it: the time its counts are as of.
    started_ns: u64,
    /// When it is (next) reported stale.
    stale_at_ns: u64,
}

/// The last `N` samples of a duration (readback latencies, step gaps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Window<const N: usize> {
    samples: [u64; N],
    next: usize,
    len: usize,
}

impl<const N: usize> Default for Window<N> {
    fn default() -> Self {
        Self {
            samples: [0; N],
            next: 0,
            len: 0,
        }
    }
}

impl<const N: usize> Window<N> {
    fn record(&mut self, ns: u64) {
        self.samples[self.next] = ns;
        self.next = (self.next + 1) % N;
        self.len = (self.len + 1).min(N);
    }

    fn max(&self) -> Option<u64> {
        self.samples[..self.len].iter().copied().max()
    }

    fn min(&self) -> Option<u64> {
        self.samples[..self.len].iter().copied().min()
    }
}

/// What happened during one tick, folded into a [`Tick`] at the end.
#[derive(Clone, Copy, Debug, Default)]
struct Outcome {
    published: Option<u64>,
    failed: bool,
    started: bool,
}

/// Reads counters back asynchronously and publishes them to a slot.
///
/// Call [`tick`](Collector::tick) once per decode step with the current time: it never blocks.
/// It polls the readbacks in flight (publishing those that finished), reports a stale one, and
/// starts a new readback when the collection grid or a consumer deadline calls for one (see the
/// sections below). Consumers read the slot on their own schedule
/// (through [`Cursor`](crate::Cursor)s), so no timer has to line up with this one. Call
/// [`flush`](Collector::flush) at shutdown.
///
/// ```
/// use specula_core::{Collector, Counters, Cursor, Readback, SeqSlot, Snapshot};
/// use core::task::Poll;
///
/// /// Counters that live "on the device": here just a field, always ready.
/// struct Host(Counters<2>);
/// impl Readback<2> for Host {
///     type Error = core::convert::Infallible;
///     fn start(&mut self) -> Result<(), Self::Error> { Ok(()) }
///     fn poll(&mut self) -> Poll<Result<Counters<2>, Self::Error>> { Poll::Ready(Ok(self.0)) }
///     fn flush(&mut self) -> Result<Counters<2>, Self::Error> { Ok(self.0) }
/// }
///
/// let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
/// let (writer, reader) = slot.split();
/// let mut device = Host(Counters::ZERO);
/// let mut collector = Collector::new(&mut device, writer, 1_000, 0).unwrap();
/// // A log line every 1 000 ns on a grid of its own: have a snapshot ready for each.
/// collector.set_deadlines(1_000, 450).unwrap();
/// let mut log = Cursor::new(reader);
/// for step in 0..10u64 {
///     collector.readback_mut().0.record(2, 1).unwrap(); // the verifier counts
///     collector.tick(step * 300);
/// }
/// collector.flush(3_000).unwrap();
/// let mut total = Counters::<2>::ZERO;
/// while let Some(t) = log.take() { total.add(&t.delta); }
/// assert_eq!(total.drafts, 10);
/// ```
///
/// # When a readback starts
/// * **On the collection grid** (`start + n·period`), as long as no consumer deadlines are set:
///   the cadence scrapes are served at.
/// * **Ahead of each consumer deadline**, once [`Collector::set_deadlines`] has told the
///   collector when its consumers next need a fresh snapshot (a log sink's grid). The goal: a
///   publication in every deadline interval `(T − period, T]`, whatever the phase between the
///   two grids, *robustly*: a readback slower or faster than any seen so far still lands in
///   its interval. From the measured readback latencies (the smallest `lo` and the largest
///   `plan` of the last [`LATENCY_WINDOW`], step to step, `plan` at least `lo` plus one step
///   gap and never less than the age of the oldest readback still in flight) and the step gap
///   (the largest of the last [`GAP_WINDOW`]), the start times whose publication lands in the
///   interval for every latency seen form a window `(T − period − lo, T − plan]`; a readback
///   starts at the step nearest the **middle** of that window. Against a latency above
///   everything seen the margin is then half of `period − (plan − lo)`, not zero, as it would
///   be starting at the last chance. (The price: a log line's counts are as of about half a
///   period plus the latency before its tick, instead of just before it; every count still
///   reaches it once.) A deadline no readback can reach any more is skipped.
///
///   Two cases are not aimed, because aiming cannot pay there; a readback then starts whenever
///   a slot is free, *paced*: at most one every `lo / slots` (the rate the ring frees slots
///   at) and one every eighth of the deadline period, so that readbacks spread out evenly
///   instead of keeping the ring's clustering:
///   - more latency than the ring can cover with one readback per deadline (the mean of `lo`
///     and `plan`, plus a gap, above `period × slots`; one slot and a latency near or above the
///     period): waiting would leave the slot idle, so with one slot the deadlines are never
///     worse than the collection grid;
///   - steps too coarse to aim with (the window is narrower than a step gap, e.g. 2 s steps
///     for a 5 s period and a latency spread of a second): several readbacks in flight cover
///     the interval where one could miss.
///
///   Where the window holds one to two step gaps, the readback is aimed (the step nearest the
///   middle lies in the window) and insured: paced readbacks also start before the aim, as
///   long as they leave one slot free for it.
///
///   Why this design rather than racing the tick with a margin or printing late: a margin
///   tuned to the latencies seen fails on the first latency outside it, and a log line
///   printed at the first publication after its tick shifts every later interval; the window
///   middle keeps half the window as margin on both sides whatever the spread, and the ring's
///   spare slots are the only insurance that costs nothing on the step path.
///
///   Until [`CALIBRATION`] readbacks have measured the latency, one is started every half
///   deadline period (at the step nearer that time). The measured extremes are widened by the
///   expected shortfall of a sample range (a `(n − 1)`-th of it at each end, for n samples).
///   If the deadline period is longer than the collection period, readbacks are also started
///   whenever a collection period has passed since the previous start, so scrapes stay fresh.
///   The figures (stale log ticks per latency band, with latency jitter, for 1, 2 and 4
///   readbacks in flight) come from `core/tests/statistics/freshness.rs` and are in `docs/GUARANTEES.md`.
///
/// Up to [`MAX_IN_FLIGHT`] readbacks are kept in flight (fewer if the backend's
/// [`Readback::max_in_flight`] is lower), so a latency above the period does not halve the
/// cadence.
///
/// # Staleness
/// A readback in flight for longer than [`Collector::stale_after_ns`] (default: three
/// collection periods, at least [`MIN_STALE_NS`]) counts as a readback error
/// ([`CollectError::Stale`], `readback_errors` raised and the last good counters republished,
/// so every consumer sees it). The collector then asks the backend to
/// [`abandon`](Readback::abandon) it: if it can, the ring slot is freed and collection goes on;
/// if it cannot, the collector keeps polling it (publishing it if it ever completes) and
/// reports it again after each further staleness deadline. Either way `tick` never blocks, and
/// [`Collector::flush`] still recovers every count. The time of the last successful collection
/// is the published snapshot's `at_ns` (the clock time its counts are as of), so a consumer
/// computes the data's age as `now − at_ns`.
pub struct Collector<'a, R: Readback<K>, const K: usize> {
    readback: R,
    writer: SlotWriter<'a, Snapshot<K>>,
    interval: Interval,
    /// The consumers' deadline grid; its `next_ns` is the earliest deadline not yet served.
    deadlines: Option<Interval>,
    flight: Flight<Entry>,
    /// When a readback was last started, or tried (a failed start is not retried every tick).
    last_start_ns: Option<u64>,
    last_tick_ns: Option<u64>,
    /// The last times between ticks.
    gaps: Window<GAP_WINDOW>,
    /// The last readback latencies, from the tick that started one to the tick that saw it.
    latencies: Window<LATENCY_WINDOW>,
    stale_after_ns: u64,
    last: Snapshot<K>,
    last_error: Option<CollectError<R::Error>>,
}

impl<R: Readback<K>, const K: usize> core::fmt::Debug for Collector<'_, R, K> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Collector")
            .field("interval", &self.interval)
            .field("deadlines", &self.deadlines)
            .field("in_flight", &self.flight.len())
            .field("latency_estimate_ns", &self.latency_estimate_ns())
            .field("stale_after_ns", &self.stale_after_ns)
            .field("last", &self.last)
            .finish_non_exhaustive()
    }
}

impl<'a, R: Readback<K>, const K: usize> Collector<'a, R, K> {
    /// A collector that reads back every `period_ns`, on a grid starting at `start_ns`.
    pub fn new(
        readback: R,
        writer: SlotWriter<'a, Snapshot<K>>,
        period_ns: u64,
        start_ns: u64,
    ) -> Result<Self, ZeroPeriod> {
        Ok(Self {
            readback,
            writer,
            interval: Interval::new(period_ns, start_ns)?,
            deadlines: None,
            flight: Flight::new(),
            last_start_ns: None,
            last_tick_ns: None,
            gaps: Window::default(),
            latencies: Window::default(),
            stale_after_ns: period_ns
                .saturating_mul(DEFAULT_STALE_PERIODS)
                .max(MIN_STALE_NS),
            last: Snapshot::ZERO,
            last_error: None,
        })
    }

    /// Tells the collector that its consumers need a fresh snapshot at `start_ns + n·period_ns`
    /// (n = 1, 2, …; a log sink's grid, on the same clock). From the next tick on, readbacks
    /// are timed so that one has been published in each interval between two deadlines. Until
    /// a first readback has measured the latency, one is started every half deadline period.
    pub fn set_deadlines(&mut self, period_ns: u64, start_ns: u64) -> Result<(), ZeroPeriod> {
        self.deadlines = Some(Interval::new(period_ns, start_ns)?);
        Ok(())
    }

    /// Goes back to readbacks on the collection grid only.
    pub fn clear_deadlines(&mut self) {
        self.deadlines = None;
    }

    /// The consumers' deadline grid, if set; its `next_ns` is the earliest deadline no
    /// readback has been started for yet.
    pub fn deadlines(&self) -> Option<&Interval> {
        self.deadlines.as_ref()
    }

    /// Sets how long a readback may stay in flight before it counts as an error (at least
    /// 1 ns).
    pub fn set_stale_after(&mut self, ns: u64) {
        self.stale_after_ns = ns.max(1);
        for e in self.flight.iter_mut() {
            e.stale_at_ns = e.started_ns.saturating_add(ns.max(1));
        }
    }

    /// How long a readback may stay in flight before it counts as an error.
    pub fn stale_after_ns(&self) -> u64 {
        self.stale_after_ns
    }

    /// The readback latency the collector plans with: the largest of the last
    /// [`LATENCY_WINDOW`] successful readbacks, from the tick that started one to the tick that
    /// published it. `None` before the first.
    pub fn latency_estimate_ns(&self) -> Option<u64> {
        self.latencies.max()
    }

    /// How many readbacks the collector keeps in flight at most: the backend's
    /// [`max_in_flight`](Readback::max_in_flight), between 1 and [`MAX_IN_FLIGHT`].
    pub fn capacity(&self) -> usize {
        self.readback.max_in_flight().clamp(1, MAX_IN_FLIGHT)
    }

    /// Drives collection; call once per decode step. Never blocks (provided the backend's
    /// `start`, `poll` and `abandon` do not, as the [`Readback`] contract requires).
    #[inline]
    pub fn tick(&mut self, now_ns: u64) -> Tick {
        // A readback seen done after a pause in the steps was not done at the previous step;
        // it counts as seen one usual gap after that, not after the pause (which would make
        // the plan wait for a latency it never had).
        let seen_by = match (self.last_tick_ns, self.gaps.max()) {
            (Some(prev), Some(gap)) => prev.saturating_add(gap).min(now_ns),
            _ => now_ns,
        };
        self.observe_gap(now_ns);
        let mut out = Outcome::default();
        self.poll_flight(seen_by, &mut out);
        self.check_stale(now_ns, &mut out);
        if self.flight.len() < self.capacity() && self.wants_start(now_ns) {
            self.start(now_ns, &mut out);
        }
        match out {
            Outcome {
                published: Some(v), ..
            } => Tick::Published(v),
            Outcome { failed: true, .. } => Tick::Failed,
            Outcome { started: true, .. } => Tick::Started,
            _ if !self.flight.is_empty() => Tick::Pending,
            _ => Tick::Idle,
        }
    }

    fn observe_gap(&mut self, now_ns: u64) {
        if let Some(prev) = self.last_tick_ns {
            self.gaps.record(now_ns.saturating_sub(prev));
        }
        self.last_tick_ns = Some(now_ns);
    }

    /// The step gap the planner uses: the largest of the last [`GAP_WINDOW`].
    fn gap_ns(&self) -> u64 {
        self.gaps.max().unwrap_or(0)
    }

    /// Polls the oldest readbacks in flight and publishes each one that finished; their
    /// latency is measured up to `seen_by`.
    fn poll_flight(&mut self, seen_by: u64, out: &mut Outcome) {
        while let Some(&entry) = self.flight.front() {
            let Poll::Ready(r) = self.readback.poll() else {
                break;
            };
            self.flight.pop();
            if r.is_ok() {
                self.latencies
                    .record(seen_by.saturating_sub(entry.started_ns));
            }
            match self.finish(r, entry.started_ns) {
                Tick::Published(v) => out.published = Some(v),
                _ => out.failed = true,
            }
        }
    }

    /// Reports the oldest readback if it is stale, and abandons it if the backend can.
    fn check_stale(&mut self, now_ns: u64, out: &mut Outcome) {
        let Some(entry) = self.flight.front_mut() else {
            return;
        };
        if now_ns < entry.stale_at_ns {
            return;
        }
        entry.stale_at_ns = now_ns.saturating_add(self.stale_after_ns);
        self.fail(CollectError::Stale);
        out.failed = true;
        if self.readback.abandon() {
            self.flight.pop();
        }
    }

    /// Whether a readback should start now (capacity permitting).
    fn wants_start(&mut self, now_ns: u64) -> bool {
        let capacity = self.capacity() as u64;
        let gap = self.gap_ns();
        let Some(deadlines) = self.deadlines.as_mut() else {
            return self.interval.due(now_ns);
        };
        // A deadline grid coarser than the collection period: keep scrapes fresh too.
        let scrape_due = deadlines.period_ns() > self.interval.period_ns()
            && self
                .last_start_ns
                .is_none_or(|s| now_ns.saturating_sub(s) >= self.interval.period_ns());
        // The age of the oldest readback still in flight: its latency is at least that.
        let oldest_age = self
            .flight
            .front()
            .map_or(0, |e| now_ns.saturating_sub(e.started_ns))
            .min(self.stale_after_ns);
        if self.latencies.len < CALIBRATION {
            // Too few latencies measured to know their spread: start one every half deadline
            // period (ring permitting), so whatever the latency, publications land at least
            // once per deadline interval until [`CALIBRATION`] of them calibrate the plan
            // below. (Faster starts fill the ring of four early and leave a gap behind them
            // at latencies above the period.) While every latency seen is below the period
            // (the ring cannot fill at that pace), of this step and the next the one nearer
            // the half period: with 2 s steps and a 5 s period, every step rather than every
            // other one.
            let half = deadlines.period_ns() / 2;
            let seen = self.latencies.max().unwrap_or(0).max(oldest_age);
            let early = if seen < deadlines.period_ns() {
                gap / 2
            } else {
                0
            };
            return scrape_due
                || self
                    .last_start_ns
                    .is_none_or(|s| now_ns.saturating_add(early) >= s.saturating_add(half));
        }
        // The latency to plan with. A readback is seen done at the first tick after it
        // completes: plan with the largest latency seen, and at least the smallest plus one
        // step gap; never less than the age of the oldest readback still in flight (it has
        // taken at least that long), counted up to the staleness limit.
        // The smallest and largest of n samples fall short of the law's own extremes by about
        // a (n − 1)-th of their range at each end (for a uniform law, the expected range of n
        // draws is (n − 1)/(n + 1) of the law's): widen them by that.
        let (lo, hi) = match (self.latencies.min(), self.latencies.max()) {
            (Some(lo), Some(hi)) => {
                let beyond = (hi - lo) / (self.latencies.len as u64 - 1);
                let hi = hi.saturating_add(beyond);
                (lo.saturating_sub(beyond), hi.max(lo.saturating_add(gap)))
            }
            _ => (0, 0),
        };
        let (lo, plan) = (lo.max(oldest_age), hi.max(oldest_age));
        // Deadlines a readback started now cannot reach are not owed one: the next deadline
        // to serve is the first one at or after the earliest publication possible.
        deadlines.due(now_ns.saturating_add(lo).saturating_sub(1));
        let deadline = deadlines.next_ns();
        let period = deadlines.period_ns();
        // Readbacks not aimed at a deadline are paced: at most one every `lo / slots` (the
        // rate at which the ring frees slots, when every readback takes at least `lo`), and
        // at most one every `period / 8`. Started whenever a slot frees, they would keep the
        // ring's clustering forever (with two slots and a latency of twice the period, pairs
        // of publications a latency apart, every other interval stale); paced, they spread
        // out evenly.
        let window = period.saturating_add(lo).saturating_sub(plan);
        let pace = (lo / capacity).max(period / 8);
        let paced = self
            .last_start_ns
            .is_none_or(|s| now_ns.saturating_sub(s) >= pace);
        // Two cases where aiming at a deadline does not pay; then readbacks start whenever a
        // slot is free, paced:
        // * more latency than the ring can cover, one readback per deadline (each holding a slot
        //   for about the middle of the latencies seen, plus a step): waiting for a
        //   deadline's window would only leave a slot idle (with one slot and a latency above
        //   the period, every other deadline), where starting at once publishes as often as
        //   the backend allows, as the collection grid does;
        // * steps too coarse to aim with: the window of start times that land in the
        //   interval for every latency seen (`period + lo − plan` wide) is narrower than a
        //   step gap, so no step may fall in it; several readbacks in flight (one per step,
        //   say two or three per interval with 2 s steps and a 5 s period) cover the
        //   interval where a single aimed one could miss it.
        let throughput_bound =
            (lo / 2 + plan / 2).saturating_add(gap) > period.saturating_mul(capacity);
        if throughput_bound || window < gap {
            return scrape_due || paced;
        }
        // Aim at the middle of the window of start times whose publication lands in
        // (deadline − period, deadline] for every latency seen: from deadline − period − lo
        // to deadline − plan. A start there is as far from both ends as the spread of
        // latencies allows, so a readback slower than any seen (or faster) still lands in its
        // interval. Of this step and the next, start at the one nearer the aim: the window
        // is at least a gap wide, so that step lies in it.
        let aim = deadline.saturating_sub((period.saturating_add(lo).saturating_add(plan)) / 2);
        if now_ns.saturating_add(gap / 2) >= aim {
            // Served: the next readback is for the deadline after this one.
            deadlines.due(deadline);
            return true;
        }
        // A window of one to two gaps holds one or two steps: the aimed step lands if the
        // latencies stay within the range seen, with little margin beyond it. Insurance:
        // paced readbacks in between, as long as they leave one slot free for the aim.
        if window < gap.saturating_mul(2) {
            return scrape_due || (self.flight.len() + 1 < capacity as usize && paced);
        }
        scrape_due
    }

    fn start(&mut self, now_ns: u64, out: &mut Outcome) {
        self.last_start_ns = Some(now_ns);
        match self.readback.start() {
            Ok(()) => {
                let entry = Entry {
                    started_ns: now_ns,
                    stale_at_ns: now_ns.saturating_add(self.stale_after_ns),
                };
                // Cannot fail: the caller checked there is room.
                let _ = self.flight.push(entry);
                out.started = true;
            }
            Err(e) => {
                self.fail(CollectError::Readback(e));
                out.failed = true;
            }
        }
    }

    /// Final, blocking readback: waits for the backend and publishes its totals, so nothing
    /// counted before shutdown is lost. Every readback in flight is retired. Returns the
    /// published version, or why nothing was published (the backend's error, or
    /// [`CollectError::NotMonotonic`]).
    pub fn flush(&mut self, now_ns: u64) -> Result<u64, CollectError<R::Error>>
    where
        R::Error: Clone,
    {
        self.flight.clear();
        let r = self.readback.flush();
        match self.finish(r, now_ns) {
            Tick::Published(v) => Ok(v),
            _ => Err(self
                .last_error
                .clone()
                .unwrap_or(CollectError::NotMonotonic)),
        }
    }

    fn finish(&mut self, r: Result<Counters<K>, R::Error>, at_ns: u64) -> Tick {
        match r {
            Err(e) => self.fail(CollectError::Readback(e)),
            Ok(c) if !c.dominates(&self.last.counters) => self.fail(CollectError::NotMonotonic),
            Ok(c) => {
                self.last.counters = c;
                self.last.at_ns = at_ns.max(self.last.at_ns);
                Tick::Published(self.writer.publish(&self.last))
            }
        }
    }

    fn fail(&mut self, e: CollectError<R::Error>) -> Tick {
        self.last_error = Some(e);
        self.last.readback_errors = self.last.readback_errors.wrapping_add(1);
        self.writer.publish(&self.last);
        Tick::Failed
    }

    /// The last snapshot published (or zero). Its `at_ns` is the time of the last successful
    /// collection.
    pub fn last(&self) -> &Snapshot<K> {
        &self.last
    }

    /// The most recent failure, if any.
    pub fn last_error(&self) -> Option<&CollectError<R::Error>> {
        self.last_error.as_ref()
    }

    /// True while a readback is in flight.
    pub fn in_flight(&self) -> bool {
        !self.flight.is_empty()
    }

    /// How many readbacks are in flight.
    pub fn in_flight_count(&self) -> usize {
        self.flight.len()
    }

    /// The backend.
    pub fn readback(&self) -> &R {
        &self.readback
    }

    /// The backend, mutably (for instance to record counts on a host backend).
    pub fn readback_mut(&mut self) -> &mut R {
        &mut self.readback
    }

    /// The collection interval.
    pub fn interval(&self) -> &Interval {
        &self.interval
    }
}
#[cfg(all(test, not(loom)))]
mod tests;
