//! Derived metrics: ratios and rates from the counters.

use specula_core::{Counters, Rates};

#[test]
fn ratios_and_rates() {
    let mut c = Counters::<3>::ZERO;
    c.record(3, 1).unwrap();
    c.record(2, 2).unwrap();
    c.record(1, 0).unwrap();
    // 6 drafted, 3 accepted, 6 emitted, 3 drafts; positions: accepted [2, 1, 0] of
    // drafted [3, 2, 1].
    assert_eq!(c.acceptance_rate(), Some(0.5));
    assert_eq!(c.system_efficiency(), Some(6.0 / 9.0));
    assert_eq!(c.mean_acceptance_length(), Some(2.0));
    assert_eq!(c.position_acceptance_rate(0), Some(2.0 / 3.0));
    assert_eq!(c.position_acceptance_rate(1), Some(0.5));
    assert_eq!(c.position_acceptance_rate(2), Some(0.0));
    assert_eq!(c.position_acceptance_rate(3), None);
    assert_eq!(c.position_acceptance_per_draft(0), Some(2.0 / 3.0));
    assert_eq!(c.position_acceptance_per_draft(1), Some(1.0 / 3.0));
    assert_eq!(c.position_acceptance_per_draft(3), None);
    assert_eq!(Counters::<3>::ZERO.position_acceptance_per_draft(0), None);
    let r = Rates {
        delta: c,
        elapsed_ns: 500_000_000,
    };
    assert_eq!(r.accepted_per_second(), Some(6.0));
    assert_eq!(r.drafted_per_second(), Some(12.0));
    assert_eq!(r.emitted_per_second(), Some(12.0));
    let none = Rates {
        delta: c,
        elapsed_ns: 0,
    };
    assert_eq!(none.drafted_per_second(), None);
    assert_eq!(none.emitted_per_second(), None);
}
