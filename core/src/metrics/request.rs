//! Per-request acceptance: [`RequestAcceptance`], a 24-byte accumulator an engine keeps with
//! each request's state and feeds from the verification call's accepted counts, and
//! [`FinishedRequests`], the histogram of finished requests' acceptance rates with counts at
//! the extremes.

use crate::metrics::CountError;
use crate::metrics::{Cell64, Words};

/// One request's acceptance so far: fed with every verification step of the request.
///
/// Per-request acceptance: [`RequestAcceptance`], a 24-byte accumulator an engine keeps with
/// each request's state and feeds from the verification call's accepted counts, and
/// [`FinishedRequests`], the histogram of finished requests' acceptance rates with counts at
/// the extremes.
///
/// The accepted counts are host values an engine already has after every verification (it needs
/// them to advance its requests and trim their KV cache), so none of this reads anything back
/// from a device or adds work to the verification: it is two additions per request per step and
/// one histogram update per finished request. Everything is integer arithmetic (bucket and
/// extreme tests are exact comparisons of `100 · accepted` with `percent · drafted`), so the
/// same requests give the same histogram on every target, merged in any order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RequestAcceptance {
    /// Verification steps that drafted at least one token for the request.
    pub steps: u64,
    /// Draft tokens proposed for it.
    pub drafted: u64,
    /// Draft tokens accepted.
    pub accepted: u64,
}

impl RequestAcceptance {
    /// Nothing recorded yet (a new request).
    pub const NEW: Self = Self {
        steps: 0,
        drafted: 0,
        accepted: 0,
    };

    /// Records one verification step of this request: `k` draft tokens, the first `accepted`
    /// accepted (the verification call's accepted count). A step without draft (`k = 0`) is
    /// not counted, as [`Counters`](crate::Counters) does not count it. Nothing changes on error.
    ///
    /// # Errors
    /// [`CountError::AcceptedExceedsDraft`] when `accepted > k`.
    pub fn record(&mut self, k: usize, accepted: usize) -> Result<(), CountError> {
        if accepted > k {
            return Err(CountError::AcceptedExceedsDraft { accepted, k });
        }
        if k != 0 {
            self.steps = self.steps.wrapping_add(1);
            self.drafted = self.drafted.wrapping_add(k as u64);
            self.accepted = self.accepted.wrapping_add(accepted as u64);
        }
        Ok(())
    }

    /// Accepted / drafted tokens, in 0–1; `None` before the first draft.
    pub fn rate(&self) -> Option<f64> {
        (self.drafted != 0).then(|| self.accepted as f64 / self.drafted as f64)
    }

    /// Tokens the request's speculative steps emitted: the accepted ones plus one per step.
    pub fn emitted(&self) -> u64 {
        self.accepted.wrapping_add(self.steps)
    }
}

/// Upper bounds of the acceptance-rate buckets of [`FinishedRequests`], in percent: finer at the
/// extremes, where a request's draft is useless (near 0) or its output may be looping (near 1).
pub const RATE_BOUNDS_PERCENT: [u32; 12] = [5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 100];

/// The thresholds of the extreme counts of [`FinishedRequests`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Extremes {
    /// A request at most this acceptance rate (percent) is counted in
    /// [`FinishedRequests::low`]: its draft contributed (nearly) nothing. Default 5.
    pub low_percent: u32,
    /// A request at least this acceptance rate (percent) over a long output is counted in
    /// [`FinishedRequests::high`]: possibly a repetition loop. Default 95.
    pub high_percent: u32,
    /// Neither extreme is counted with fewer draft tokens than this (too little evidence).
    /// Default 32.
    pub min_drafted: u64,
    /// The high extreme needs at least this many emitted tokens ([`RequestAcceptance::emitted`]).
    /// Default 256.
    pub long_output: u64,
}

impl Default for Extremes {
    fn default() -> Self {
        Self {
            low_percent: 5,
            high_percent: 95,
            min_drafted: 32,
            long_output: 256,
        }
    }
}

/// The finished requests' acceptance rates: a histogram over [`RATE_BOUNDS_PERCENT`] and the
/// counts at the extremes. Cumulative and wrapping like [`Counters`](crate::Counters), so
/// deltas and merges of several ranks are exact; it travels through a
/// [`SeqSlot`](crate::SeqSlot) ([`Words`]).
///
/// ```
/// use specula_core::metrics::{Extremes, FinishedRequests, RequestAcceptance};
/// let mut r = RequestAcceptance::NEW;
/// for _ in 0..100 {
///     r.record(4, 4).unwrap(); // every draft accepted, 500 tokens out
/// }
/// let mut done = FinishedRequests::ZERO;
/// done.record(&r, &Extremes::default());
/// assert_eq!((done.finished, done.high, done.cumulative(10), done.cumulative(11)), (1, 1, 0, 1));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct FinishedRequests {
    /// Requests finished.
    pub finished: u64,
    /// Of those, requests that never drafted (no rate; in no bucket).
    pub undrafted: u64,
    /// `buckets[i]`: requests whose rate is in `(RATE_BOUNDS_PERCENT[i-1], RATE_BOUNDS_PERCENT[i]]`
    /// percent (the first bucket from 0 included); not cumulative.
    pub buckets: [u64; 12],
    /// Σ of the rates in millionths, each rounded down: the histogram's sum.
    pub rate_sum_micros: u64,
    /// Requests at the low extreme ([`Extremes::low_percent`]).
    pub low: u64,
    /// Requests at the high extreme over a long output ([`Extremes::high_percent`]).
    pub high: u64,
}

impl FinishedRequests {
    /// Nothing recorded.
    pub const ZERO: Self = Self {
        finished: 0,
        undrafted: 0,
        buckets: [0; 12],
        rate_sum_micros: 0,
        low: 0,
        high: 0,
    };

    /// Records a finished request.
    pub fn record(&mut self, r: &RequestAcceptance, x: &Extremes) {
        self.finished = self.finished.wrapping_add(1);
        if r.drafted == 0 {
            self.undrafted = self.undrafted.wrapping_add(1);
            return;
        }
        // Exact comparisons: rate ≤ p % ⟺ 100 · accepted ≤ p · drafted (no overflow in u128).
        let (a, d) = (u128::from(r.accepted), u128::from(r.drafted));
        let at_most = |p: u32| 100 * a <= u128::from(p) * d;
        // A rate above 100 % (fields set by hand) goes to the last bucket.
        let i = RATE_BOUNDS_PERCENT
            .iter()
            .position(|&p| at_most(p))
            .unwrap_or(RATE_BOUNDS_PERCENT.len() - 1);
        self.buckets[i] = self.buckets[i].wrapping_add(1);
        let micros = u64::try_from(a * 1_000_000 / d).unwrap_or(u64::MAX);
        self.rate_sum_micros = self.rate_sum_micros.wrapping_add(micros);
        if r.drafted >= x.min_drafted {
            if at_most(x.low_percent) {
                self.low = self.low.wrapping_add(1);
            }
            if r.emitted() >= x.long_output && 100 * a >= u128::from(x.high_percent) * d {
                self.high = self.high.wrapping_add(1);
            }
        }
    }

    /// Requests whose rate is at most `RATE_BOUNDS_PERCENT[i]` (a histogram's cumulative
    /// bucket); every drafted request for `i` past the last bound.
    pub fn cumulative(&self, i: usize) -> u64 {
        let n = (i + 1).min(self.buckets.len());
        self.buckets[..n]
            .iter()
            .fold(0u64, |s, &b| s.wrapping_add(b))
    }

    /// Finished requests that drafted (the histogram's count).
    pub fn drafted_requests(&self) -> u64 {
        self.finished.wrapping_sub(self.undrafted)
    }

    /// Adds `other` (wrapping): merges ranks.
    pub fn add(&mut self, other: &Self) {
        let mut w = self.words();
        for (a, b) in w.iter_mut().zip(other.words()) {
            *a = a.wrapping_add(b);
        }
        *self = Self::from_words(w);
    }

    /// `self − earlier` (wrapping): the requests finished in between.
    #[must_use]
    pub fn delta_since(&self, earlier: &Self) -> Self {
        let mut w = self.words();
        for (a, b) in w.iter_mut().zip(earlier.words()) {
            *a = a.wrapping_sub(b);
        }
        Self::from_words(w)
    }

    fn words(&self) -> [u64; 17] {
        let mut w = [0u64; 17];
        w[..12].copy_from_slice(&self.buckets);
        w[12..].copy_from_slice(&[
            self.finished,
            self.undrafted,
            self.rate_sum_micros,
            self.low,
            self.high,
        ]);
        w
    }

    fn from_words(w: [u64; 17]) -> Self {
        let mut buckets = [0u64; 12];
        buckets.copy_from_slice(&w[..12]);
        Self {
            finished: w[12],
            undrafted: w[13],
            buckets,
            rate_sum_micros: w[14],
            low: w[15],
            high: w[16],
        }
    }
}

/// Atomic storage of [`FinishedRequests`].
#[derive(Debug)]
pub struct FinishedRequestsStorage([Cell64; 17]);

impl Words for FinishedRequests {
    type Storage = FinishedRequestsStorage;
    fn to_storage(&self) -> FinishedRequestsStorage {
        FinishedRequestsStorage(self.words().to_storage())
    }
    #[inline]
    fn store(&self, s: &FinishedRequestsStorage) {
        self.words().store(&s.0);
    }
    #[inline]
    fn load(s: &FinishedRequestsStorage) -> Self {
        Self::from_words(<[u64; 17]>::load(&s.0))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::SeqSlot;

    fn request(steps: &[(usize, usize)]) -> RequestAcceptance {
        let mut r = RequestAcceptance::NEW;
        for &(k, a) in steps {
            r.record(k, a).unwrap();
        }
        r
    }

    #[test]
    fn a_request_accumulates_its_steps() {
        let mut r = request(&[(4, 2), (4, 4), (0, 0), (3, 0)]);
        assert_eq!(
            r,
            RequestAcceptance {
                steps: 3,
                drafted: 11,
                accepted: 6
            }
        );
        assert_eq!(r.rate(), Some(6.0 / 11.0));
        assert_eq!(r.emitted(), 9);
        let before = r;
        assert_eq!(
            r.record(2, 3),
            Err(CountError::AcceptedExceedsDraft { accepted: 3, k: 2 })
        );
        assert_eq!(
            r.record(0, 1),
            Err(CountError::AcceptedExceedsDraft { accepted: 1, k: 0 })
        );
        assert_eq!(r, before);
        assert_eq!(RequestAcceptance::NEW.rate(), None);
        assert_eq!(RequestAcceptance::default(), RequestAcceptance::NEW);
    }

    #[test]
    fn rates_fall_in_the_bucket_of_their_upper_bound() {
        let x = Extremes::default();
        let mut h = FinishedRequests::ZERO;
        // accepted / drafted at every bound, just above it, and 0.
        for (a, d, bucket) in [
            (0, 20, 0),
            (1, 20, 0),   // 5 %: on the first bound
            (11, 200, 1), // 5.5 %
            (1, 10, 1),   // 10 %
            (21, 100, 3), // 21 %
            (1, 2, 5),    // 50 %
            (19, 20, 10), // 95 %
            (99, 100, 11),
            (7, 7, 11), // 100 %
        ] {
            let before = h.buckets;
            h.record(&request(&[(d, a)]), &x);
            let mut want = before;
            want[bucket] += 1;
            assert_eq!(h.buckets, want, "{a}/{d}");
        }
        assert_eq!(h.finished, 9);
        assert_eq!(h.drafted_requests(), 9);
        let micros = [
            0, 50_000, 55_000, 100_000, 210_000, 500_000, 950_000, 990_000, 1_000_000,
        ];
        assert_eq!(h.rate_sum_micros, micros.iter().sum::<u64>());
        assert_eq!(h.cumulative(0), 2);
        assert_eq!(h.cumulative(1), 4);
        assert_eq!(h.cumulative(11), 9);
        assert_eq!(h.cumulative(50), 9);
        // Rounded down, never up: 1/3 is 333 333 millionths.
        let mut third = FinishedRequests::ZERO;
        third.record(&request(&[(3, 1)]), &x);
        assert_eq!(third.rate_sum_micros, 333_333);
        // Set by hand above 100 %: the last bucket, not a panic.
        let mut odd = FinishedRequests::ZERO;
        let r = RequestAcceptance {
            steps: 1,
            drafted: 2,
            accepted: 3,
        };
        odd.record(&r, &x);
        assert_eq!(odd.buckets[11], 1);
    }

    #[test]
    fn extremes_need_enough_evidence() {
        let x = Extremes::default();
        let mut h = FinishedRequests::ZERO;
        // Low: 1 of 40 drafted (2.5 %), and the boundary 2 of 40 (5 %); 3 of 40 is not.
        for a in [1, 2, 3] {
            let mut r = RequestAcceptance::NEW;
            r.record(40, a).unwrap();
            h.record(&r, &x);
        }
        assert_eq!(h.low, 2);
        // Too few draft tokens: not counted, however low.
        h.record(&request(&[(31, 0)]), &x);
        assert_eq!(h.low, 2);
        h.record(&request(&[(32, 0)]), &x);
        assert_eq!(h.low, 3);
        // High: 95 % or more over at least 256 emitted tokens.
        let long: [(usize, usize); 64] = [(4, 4); 64]; // 256 accepted + 64 = 320 emitted
        h.record(&request(&long), &x);
        assert_eq!(h.high, 1);
        let mut short = [(4, 4); 64];
        short[0] = (4, 3); // 255 of 256: 99.6 %
        h.record(&request(&short), &x);
        assert_eq!(h.high, 2);
        let shortest = [(4, 4); 51]; // 204 + 51 = 255 emitted: too short
        h.record(&request(&shortest), &x);
        assert_eq!(h.high, 2);
        let mut just = request(&shortest);
        just.record(1, 0).unwrap(); // 256 emitted exactly, 204 of 205: long enough
        assert_eq!(just.emitted(), 256);
        h.record(&just, &x);
        assert_eq!(h.high, 3);
        let mut r = request(&[(4, 4); 60]);
        r.record(20, 0).unwrap(); // 240 of 260: 92.3 %
        h.record(&r, &x);
        assert_eq!(h.high, 3);
        let mut r = request(&[(4, 4); 60]);
        r.record(20, 7).unwrap(); // 247 of 260: exactly 95 %
        h.record(&r, &x);
        assert_eq!(h.high, 4);
        // Never drafted: finished, in no bucket, no extreme.
        let before = h;
        h.record(&RequestAcceptance::NEW, &x);
        assert_eq!((h.finished, h.undrafted), (before.finished + 1, 1));
        assert_eq!(h.buckets, before.buckets);
        assert_eq!(h.drafted_requests(), before.finished);
    }

    #[test]
    fn histograms_merge_and_delta_exactly_and_travel_through_a_slot() {
        let x = Extremes::default();
        let mut a = FinishedRequests::ZERO;
        a.record(&request(&[(40, 1)]), &x);
        let mut b = a;
        b.record(&request(&[(4, 4); 64]), &x);
        b.record(&RequestAcceptance::NEW, &x);
        b.rate_sum_micros = b.rate_sum_micros.wrapping_add(u64::MAX); // wraps like counters
        let d = b.delta_since(&a);
        assert_eq!((d.finished, d.undrafted, d.high, d.low), (2, 1, 1, 0));
        let mut back = a;
        back.add(&d);
        assert_eq!(back, b);
        assert_eq!(FinishedRequests::load(&b.to_storage()), b);
        let mut slot = SeqSlot::new(FinishedRequests::ZERO);
        let (mut w, r) = slot.split();
        w.publish(&b);
        assert_eq!(r.read(), (b, 1));
        let mut bucket_order = FinishedRequests::ZERO;
        bucket_order.buckets = core::array::from_fn(|i| i as u64 + 1);
        bucket_order.finished = 100;
        assert_eq!(
            FinishedRequests::load(&bucket_order.to_storage()),
            bucket_order
        );
    }
}
