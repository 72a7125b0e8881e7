//! [`Collector`]: the asynchronous collection state machine, driven once per decode step.

use crate::counters::{Counters, Snapshot};
use crate::interval::Interval;
use crate::readback::Readback;
use crate::slot::SlotWriter;
use core::task::Poll;

/// What one [`Collector::tick`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Tick {
    /// Nothing due and nothing in flight.
    Idle,
    /// A readback was started.
    Started,
    /// A readback is in flight and not finished.
    Pending,
    /// A readback finished and was published as this version.
    Published(u64),
    /// A readback failed; the last good counters were republished with the error count raised.
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
}

impl<E: core::fmt::Debug> core::fmt::Display for CollectError<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Readback(e) => write!(f, "counter readback failed: {e:?}"),
            Self::NotMonotonic => f.write_str("readback returned decreasing counters"),
        }
    }
}

impl<E: core::fmt::Debug> core::error::Error for CollectError<E> {}

/// Reads counters back asynchronously on a fixed cadence and publishes them to a slot.
///
/// Call [`tick`](Collector::tick) once per decode step with the current time: it never blocks.
/// When the interval is due it starts a readback; while one is in flight it polls it; a finished
/// one is published to the slot. Consumers read the slot on their own schedule (through
/// [`Cursor`](crate::Cursor)s), so no timer has to line up with this one. Call
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
pub struct Collector<'a, R: Readback<K>, const K: usize> {
    readback: R,
    writer: SlotWriter<'a, Snapshot<K>>,
    interval: Interval,
    /// Start time of the readback in flight.
    in_flight: Option<u64>,
    last: Snapshot<K>,
    last_error: Option<CollectError<R::Error>>,
}

impl<'a, R: Readback<K>, const K: usize> Collector<'a, R, K> {
    /// A collector that reads back every `period_ns`, on a grid starting at `start_ns`.
    pub fn new(
        readback: R,
        writer: SlotWriter<'a, Snapshot<K>>,
        period_ns: u64,
        start_ns: u64,
    ) -> Result<Self, crate::interval::ZeroPeriod> {
        Ok(Self {
            readback,
            writer,
            interval: Interval::new(period_ns, start_ns)?,
            in_flight: None,
            last: Snapshot::ZERO,
            last_error: None,
        })
    }

    /// Drives collection; call once per decode step. Never blocks (provided the backend's
    /// `start` and `poll` do not, as the [`Readback`] contract requires).
    #[inline]
    pub fn tick(&mut self, now_ns: u64) -> Tick {
        match self.in_flight {
            Some(started) => match self.readback.poll() {
                Poll::Pending => Tick::Pending,
                Poll::Ready(r) => {
                    self.in_flight = None;
                    self.finish(r, started)
                }
            },
            None => {
                if !self.interval.due(now_ns) {
                    return Tick::Idle;
                }
                match self.readback.start() {
                    Ok(()) => {
                        self.in_flight = Some(now_ns);
                        Tick::Started
                    }
                    Err(e) => self.fail(CollectError::Readback(e)),
                }
            }
        }
    }

    /// Final, blocking readback: waits for the backend and publishes its totals, so nothing
    /// counted before shutdown is lost. Returns the published version.
    pub fn flush(&mut self, now_ns: u64) -> Result<u64, CollectError<R::Error>>
    where
        R::Error: Clone,
    {
        self.in_flight = None;
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

    /// The last snapshot published (or zero).
    pub fn last(&self) -> &Snapshot<K> {
        &self.last
    }

    /// The most recent failure, if any.
    pub fn last_error(&self) -> Option<&CollectError<R::Error>> {
        self.last_error.as_ref()
    }

    /// True while a readback is in flight.
    pub fn in_flight(&self) -> bool {
        self.in_flight.is_some()
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
mod tests {
    use super::*;
    use crate::{Cursor, SeqSlot};

    /// A scripted backend: each readback takes `latency` polls; `fail_next` fails the next one.
    struct Scripted {
        device: Counters<2>,
        pending: Option<(Counters<2>, u32)>,
        latency: u32,
        fail_next: bool,
        starts: u32,
    }

    impl Readback<2> for Scripted {
        type Error = &'static str;
        fn start(&mut self) -> Result<(), &'static str> {
            assert!(self.pending.is_none(), "start while in flight");
            self.starts += 1;
            self.pending = Some((self.device, self.latency));
            Ok(())
        }
        fn poll(&mut self) -> Poll<Result<Counters<2>, &'static str>> {
            let (c, left) = self.pending.as_mut().expect("poll with nothing in flight");
            if *left > 0 {
                *left -= 1;
                return Poll::Pending;
            }
            let c = *c;
            self.pending = None;
            if core::mem::take(&mut self.fail_next) {
                return Poll::Ready(Err("copy failed"));
            }
            Poll::Ready(Ok(c))
        }
        fn flush(&mut self) -> Result<Counters<2>, &'static str> {
            self.pending = None;
            Ok(self.device)
        }
    }

    fn scripted(latency: u32) -> Scripted {
        Scripted {
            device: Counters::ZERO,
            pending: None,
            latency,
            fail_next: false,
            starts: 0,
        }
    }

    #[test]
    fn starts_polls_publishes() {
        let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
        let (w, r) = slot.split();
        let mut c = Collector::new(scripted(2), w, 100, 0).unwrap();
        assert_eq!(c.tick(50), Tick::Idle);
        c.readback_mut().device.record(2, 1).unwrap();
        assert_eq!(c.tick(100), Tick::Started);
        c.readback_mut().device.record(2, 2).unwrap(); // after the copy point
        assert_eq!(c.tick(110), Tick::Pending);
        assert_eq!(c.tick(120), Tick::Pending);
        assert_eq!(c.tick(130), Tick::Published(1));
        let (s, v) = r.read();
        assert_eq!(v, 1);
        assert_eq!(s.counters.drafts, 1, "snapshot is as of start()");
        assert_eq!(s.at_ns, 100);
        assert_eq!(c.tick(140), Tick::Idle);
        assert_eq!(c.flush(150), Ok(2));
        assert_eq!(r.read().0.counters.drafts, 2);
    }

    #[test]
    fn failures_keep_last_good_and_are_counted() {
        let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
        let (w, r) = slot.split();
        let mut c = Collector::new(scripted(0), w, 10, 0).unwrap();
        c.readback_mut().device.record(1, 1).unwrap();
        assert_eq!(c.tick(10), Tick::Started);
        assert_eq!(c.tick(11), Tick::Published(1));
        c.readback_mut().device.record(1, 0).unwrap();
        c.readback_mut().fail_next = true;
        assert_eq!(c.tick(20), Tick::Started);
        assert_eq!(c.tick(21), Tick::Failed);
        let (s, _) = r.read();
        assert_eq!(s.counters.drafts, 1);
        assert_eq!(s.readback_errors, 1);
        assert_eq!(c.last_error(), Some(&CollectError::Readback("copy failed")));
        assert_eq!(c.tick(30), Tick::Started);
        assert!(matches!(c.tick(31), Tick::Published(_)));
        let (s, _) = r.read();
        assert_eq!((s.counters.drafts, s.readback_errors), (2, 1));
    }

    #[test]
    fn decreasing_counters_are_rejected() {
        let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
        let (w, r) = slot.split();
        let mut c = Collector::new(scripted(0), w, 10, 0).unwrap();
        c.readback_mut().device.record(2, 2).unwrap();
        c.tick(10);
        c.tick(11);
        c.readback_mut().device = Counters::ZERO; // device reset behind our back
        c.tick(20);
        assert_eq!(c.tick(21), Tick::Failed);
        assert_eq!(c.last_error(), Some(&CollectError::NotMonotonic));
        assert_eq!(r.read().0.counters.drafts, 1);
        assert_eq!(c.flush(30), Err(CollectError::NotMonotonic));
    }

    #[test]
    fn one_readback_at_a_time_even_when_late() {
        let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
        let (w, r) = slot.split();
        let mut c = Collector::new(scripted(5), w, 10, 0).unwrap();
        for t in 0..200 {
            c.tick(t * 3);
        }
        // 600 ns at 10 ns period but each readback takes 6 ticks (start + 5 pending)
        assert!(c.readback().starts > 10 && c.readback().starts < 60);
        let mut cur = Cursor::new(r);
        assert!(cur.take().is_some());
    }
}
