//! The conformance suite on the CPU backend, with 1 and 4 threads, plus the fuzzed entry point
//! and readback consistency under concurrent verification.

use proptest::prelude::*;
use specula::cpu::CpuVerifier;
use specula_tests::conformance::{self, K};

fn one() -> CpuVerifier<K> {
    CpuVerifier::new(1).unwrap()
}

fn many() -> CpuVerifier<K> {
    CpuVerifier::new(4).unwrap()
}

#[test]
fn conformance_one_thread() {
    conformance::run_all(one);
}

#[test]
fn conformance_four_threads() {
    conformance::run_all(many);
}

/// Bigger vocabularies than the suite's, so the chunked loops run many full blocks.
#[test]
fn matches_reference_on_large_vocabularies() {
    let mut g = conformance::Gen(0xB16_70CA);
    let mut v = many();
    for i in 0..60 {
        let (d, _) = conformance::random_batch(
            &mut g,
            conformance::RandomSpec {
                max_requests: 5,
                max_vocab: 3000,
                garbage: true,
            },
        );
        for m in conformance::METHODS {
            conformance::assert_matches_reference(
                &mut v,
                m,
                specula_core::verify::Check::Cheap,
                &d,
                &format!("large batch {i}"),
            );
        }
    }
}

/// Snapshots taken while other threads verify always hold whole batches: every batch here
/// has exactly 3 requests of k = 2, so any consistent snapshot has drafts = 3n and
/// draft_tokens = 6n.
#[test]
fn readback_is_batch_consistent_under_concurrency() {
    use specula_core::Readback;
    use specula_core::verify::{Check, Method};
    use std::sync::Arc;
    use std::task::Poll;
    let v = Arc::new(many());
    let mut g = conformance::Gen(3);
    let mut d = conformance::random_batch(&mut g, Default::default()).0;
    while d.requests() != 3 || d.k_max < 2 {
        d = conformance::random_batch(&mut g, Default::default()).0;
    }
    d.k.fill(2);
    // Slots past the original k held out-of-range ids: make the first two valid.
    for b in 0..3 {
        d.draft_ids[b * d.k_max + 1] = 0;
    }
    let d = Arc::new(d);
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let (v, d) = (Arc::clone(&v), Arc::clone(&d));
            std::thread::spawn(move || {
                for _ in 0..300 {
                    let mut out = conformance::OutData::new(3, d.k_max);
                    v.verify(Method::Rejection, Check::Cheap, &d.view(), &mut out.view())
                        .unwrap();
                }
            })
        })
        .collect();
    let mut r = v.readback();
    let mut last = specula_core::Counters::<K>::ZERO;
    for _ in 0..2000 {
        r.start().unwrap();
        let Poll::Ready(Ok(c)) = r.poll() else {
            panic!("CPU readback completes at once")
        };
        assert_eq!(c.drafts % 3, 0, "partial batch visible: {c:?}");
        assert_eq!(c.draft_tokens, 2 * c.drafts);
        assert_eq!(c.drafted_per_position[1], c.drafts);
        assert!(c.dominates(&last), "counters went backwards");
        last = c;
    }
    for w in workers {
        w.join().unwrap();
    }
    let f = r.flush().unwrap();
    assert_eq!(f.drafts, 3 * 3 * 300);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]
    /// Arbitrary input never panics and matches the reference (outputs or error).
    #[test]
    fn fuzz_entry_point(input in conformance::arb_fuzz_input(), threads in 1usize..=3) {
        let mut v = CpuVerifier::<K>::new(threads).unwrap();
        conformance::fuzz_one(&mut v, &input);
    }
}

/// Ragged and padded layouts give the reference's bits at real vocabulary sizes, on one thread
/// and on a pool (the row-splitting path included).
#[test]
fn ragged_matches_padded_at_32k() {
    conformance::ragged_matches_padded_at(&mut one(), 0x32_001, 32_000, 2);
    conformance::ragged_matches_padded_at(&mut many(), 0x32_002, 32_768, 2);
}
