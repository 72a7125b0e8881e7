//! The [`Readback`] seam: how a collector gets counters back from where they accumulate.

use crate::metrics::Counters;
use core::task::Poll;

/// Misuse of a [`Readback`], answered the same way by every implementation (and checked by the
/// readback conformance suite of `specula-tests`):
/// * [`poll`](Readback::poll) with nothing in flight returns `Ready(Err(e))` where `e` is (or
///   wraps) [`Misuse::NothingInFlight`];
/// * [`start`](Readback::start) with [`max_in_flight`](Readback::max_in_flight) readbacks in
///   flight returns `Err(e)` where `e` is (or wraps) [`Misuse::AlreadyInFlight`], and changes
///   nothing.
///
/// Both have [`ErrorKind::Misuse`](crate::ErrorKind::Misuse).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Misuse {
    /// `poll` with no readback in flight.
    NothingInFlight,
    /// `start` with `max_in_flight` readbacks already in flight.
    AlreadyInFlight,
}

impl crate::error_kind::HasKind for Misuse {
    fn kind(&self) -> crate::ErrorKind {
        crate::ErrorKind::Misuse
    }
}

impl core::fmt::Display for Misuse {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::NothingInFlight => "no readback in flight",
            Self::AlreadyInFlight => "as many readbacks in flight as allowed",
        })
    }
}

/// An asynchronous copy of device-side counters to the host.
///
/// The contract a backend implements:
/// * [`start`](Readback::start) enqueues a copy of the counters as they stand at this point of
///   the device's work and returns at once; it never waits for the device.
/// * [`poll`](Readback::poll) reports whether the *oldest* copy in flight has finished, without
///   waiting. A `Ready` answer (success or error) retires that copy.
/// * [`flush`](Readback::flush) may block: it waits for all work recorded so far and returns
///   the final totals; every copy still in flight is retired. It is called at shutdown so
///   nothing counted is lost.
/// * [`max_in_flight`](Readback::max_in_flight) (default 1) says how many copies may be in
///   flight at once; they finish in the order they were started (as copies on one stream do).
/// * [`abandon`](Readback::abandon) (default: cannot) gives up the oldest copy in flight when
///   the collector declares it stale; a backend returns `true` only when the copy's buffers can
///   safely be reused.
///
/// Counters are cumulative totals; each completed readback must be at least the previous one
/// field by field (the collector rejects one that is not).
pub trait Readback<const K: usize> {
    /// Why a readback failed.
    type Error: core::fmt::Debug;

    /// Starts one readback. Called only while fewer than
    /// [`max_in_flight`](Readback::max_in_flight) are in flight.
    fn start(&mut self) -> Result<(), Self::Error>;

    /// Polls the oldest readback in flight: `Pending` until it is done. Never blocks.
    fn poll(&mut self) -> Poll<Result<Counters<K>, Self::Error>>;

    /// Waits for everything counted so far and returns the totals; retires every readback in
    /// flight. May block.
    fn flush(&mut self) -> Result<Counters<K>, Self::Error>;

    /// How many readbacks may be in flight at once: at least 1 (a 0 is read as 1). The
    /// collector uses at most [`MAX_IN_FLIGHT`](crate::metrics::MAX_IN_FLIGHT).
    fn max_in_flight(&self) -> usize {
        1
    }

    /// Gives up the oldest readback in flight, which the collector found stale. Returns `true`
    /// if the backend released it (the collector stops polling it and may start another in its
    /// place), `false` if it cannot yet (the collector keeps polling it, and publishes it if it
    /// ever completes). The default cannot.
    fn abandon(&mut self) -> bool {
        false
    }
}

impl<const K: usize, R: Readback<K> + ?Sized> Readback<K> for &mut R {
    type Error = R::Error;
    fn start(&mut self) -> Result<(), Self::Error> {
        (**self).start()
    }
    fn poll(&mut self) -> Poll<Result<Counters<K>, Self::Error>> {
        (**self).poll()
    }
    fn flush(&mut self) -> Result<Counters<K>, Self::Error> {
        (**self).flush()
    }
    fn max_in_flight(&self) -> usize {
        (**self).max_in_flight()
    }
    fn abandon(&mut self) -> bool {
        (**self).abandon()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A backend whose every answer is distinct, to see that `&mut R` forwards each call.
    struct Fake {
        fail_start: bool,
        starts: u32,
        abandons: u32,
    }

    fn counters(drafts: u64) -> Counters<2> {
        let mut c = Counters::ZERO;
        c.drafts = drafts;
        c
    }

    impl Readback<2> for Fake {
        type Error = u8;
        fn start(&mut self) -> Result<(), u8> {
            self.starts += 1;
            if self.fail_start { Err(7) } else { Ok(()) }
        }
        fn poll(&mut self) -> Poll<Result<Counters<2>, u8>> {
            Poll::Ready(Ok(counters(3)))
        }
        fn flush(&mut self) -> Result<Counters<2>, u8> {
            Ok(counters(4))
        }
        fn max_in_flight(&self) -> usize {
            3
        }
        fn abandon(&mut self) -> bool {
            self.abandons += 1;
            self.abandons % 2 == 1
        }
    }

    /// A backend that keeps the trait's defaults.
    struct Plain;

    impl Readback<2> for Plain {
        type Error = u8;
        fn start(&mut self) -> Result<(), u8> {
            Ok(())
        }
        fn poll(&mut self) -> Poll<Result<Counters<2>, u8>> {
            Poll::Pending
        }
        fn flush(&mut self) -> Result<Counters<2>, u8> {
            Err(1)
        }
    }

    #[test]
    fn defaults_are_one_in_flight_and_no_abandon() {
        let mut p = Plain;
        assert_eq!(p.max_in_flight(), 1);
        assert!(!p.abandon());
        // Through `&mut R` too.
        let mut r = &mut p;
        assert_eq!(Readback::<2>::max_in_flight(&r), 1);
        assert!(!Readback::<2>::abandon(&mut r));
        assert_eq!(Readback::<2>::poll(&mut r), Poll::Pending);
        assert_eq!(Readback::<2>::flush(&mut r), Err(1));
    }

    #[test]
    fn a_mutable_reference_forwards_every_call() {
        let mut f = Fake {
            fail_start: false,
            starts: 0,
            abandons: 0,
        };
        {
            let mut r = &mut f;
            assert_eq!(r.start(), Ok(()));
            r.fail_start = true;
            assert_eq!(Readback::start(&mut r), Err(7));
            assert_eq!(Readback::poll(&mut r), Poll::Ready(Ok(counters(3))));
            assert_eq!(Readback::flush(&mut r), Ok(counters(4)));
            assert_eq!(Readback::max_in_flight(&r), 3);
            assert!(Readback::abandon(&mut r));
            assert!(!Readback::abandon(&mut r));
        }
        assert_eq!((f.starts, f.abandons), (2, 2));
    }
}
