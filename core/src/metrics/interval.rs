//! [`Interval`]: a cadence on a fixed grid over a caller-supplied clock.

/// Fires at `start + n·period` for n = 1, 2, …: the grid never drifts, however late the
/// caller checks, and a late check fires once, not once per missed tick.
///
/// ```
/// use specula_core::Interval;
/// let mut i = Interval::new(100, 0).unwrap();
/// assert!(!i.due(99));
/// assert!(i.due(100));
/// assert!(!i.due(150));
/// assert!(i.due(450)); // late: fires once...
/// assert!(!i.due(460));
/// assert_eq!(i.next_ns(), 500); // ...and stays on the grid
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Interval {
    period_ns: u64,
    next_ns: u64,
}

/// A zero-length period was asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ZeroPeriod;

impl core::fmt::Display for ZeroPeriod {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("interval period must be greater than zero")
    }
}

impl core::error::Error for ZeroPeriod {}

impl Interval {
    /// An interval of `period_ns` whose first tick is at `start_ns + period_ns`.
    pub const fn new(period_ns: u64, start_ns: u64) -> Result<Self, ZeroPeriod> {
        if period_ns == 0 {
            return Err(ZeroPeriod);
        }
        Ok(Self {
            period_ns,
            next_ns: start_ns.saturating_add(period_ns),
        })
    }

    /// True at most once per grid point reached: when `now_ns` has reached the next tick.
    /// The next tick becomes the first grid point after `now_ns`.
    #[inline]
    pub fn due(&mut self, now_ns: u64) -> bool {
        if now_ns < self.next_ns {
            return false;
        }
        let missed = (now_ns - self.next_ns) / self.period_ns;
        self.next_ns = self
            .next_ns
            .saturating_add(missed.saturating_add(1).saturating_mul(self.period_ns));
        true
    }

    /// The period in nanoseconds.
    pub const fn period_ns(&self) -> u64 {
        self.period_ns
    }

    /// When the next tick is due.
    pub const fn next_ns(&self) -> u64 {
        self.next_ns
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn zero_period_is_an_error() {
        assert_eq!(Interval::new(0, 5), Err(ZeroPeriod));
        let mut s: heapless::String<64> = heapless::String::new();
        core::fmt::write(&mut s, format_args!("{ZeroPeriod}")).unwrap();
        assert_eq!(s.as_str(), "interval period must be greater than zero");
    }

    #[test]
    fn stays_on_grid_under_jitter() {
        let mut i = Interval::new(10, 3).unwrap();
        let mut fired = 0;
        for t in (0..1000).step_by(7) {
            if i.due(t) {
                fired += 1;
                assert_eq!((i.next_ns() - 3) % 10, 0);
                assert!(i.next_ns() > t && i.next_ns() <= t + 10);
            }
        }
        // ticks at 13, 23, ..., 993 → 99 grid points, each reached by some multiple of 7
        assert_eq!(fired, 99);
    }

    #[test]
    fn saturates_at_the_end_of_time() {
        let mut i = Interval::new(u64::MAX / 2, u64::MAX - 1).unwrap();
        assert!(!i.due(u64::MAX - 1));
        assert!(i.due(u64::MAX));
    }

    #[test]
    fn a_late_check_fires_once_and_lands_on_the_next_grid_point() {
        let mut i = Interval::new(100, 0).unwrap();
        assert_eq!(i.period_ns(), 100);
        assert_eq!(i.next_ns(), 100);
        // Two and a half periods late: one firing, and the next tick is the grid point after.
        assert!(i.due(350));
        assert_eq!(i.next_ns(), 400);
        assert!(
            !i.due(350),
            "a late check fires once, not once per missed tick"
        );
        assert!(!i.due(399));
        assert!(i.due(400));
        assert_eq!(i.next_ns(), 500);
        // Exactly on a grid point several periods late.
        assert!(i.due(900));
        assert_eq!(i.next_ns(), 1000);
        assert_eq!(i.period_ns(), 100);
    }

    #[test]
    fn next_tick_saturates_instead_of_wrapping() {
        let i = Interval::new(10, u64::MAX - 5).unwrap();
        assert_eq!(i.next_ns(), u64::MAX);
        let mut i = Interval::new(10, u64::MAX - 25).unwrap();
        assert_eq!(i.next_ns(), u64::MAX - 15);
        assert!(i.due(u64::MAX - 1));
        assert_eq!(
            i.next_ns(),
            u64::MAX,
            "saturated, not wrapped to a small value"
        );
        // The grid cannot go past the end of time: there it stays, due at every check.
        assert!(i.due(u64::MAX));
        assert_eq!(i.next_ns(), u64::MAX);
    }
}
