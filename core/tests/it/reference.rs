//! The reference verifier: row reductions and whole batches, pinned by known answers.

use crate::support::{Fnv, Mix};
use specula_core::Counters;
use specula_core::verify::exponential::exponential;
use specula_core::verify::philox::{race_words, race_words_lo};
use specula_core::verify::{
    Batch, Check, DEFAULT_DELTA, DEFAULT_EPS, Dims, Drafts, Logits, Method, Outputs, RaceRng,
    Reference, RowOps, SENTINEL, ScalarOps, Streams, Verifier, argmax, race, race_key,
    race_residual, verify_batch, verify_request,
};

const RNG: RaceRng = RaceRng {
    seed: 7,
    offset: 11,
    position: 2,
};

#[test]
fn argmax_ties_nan_and_infinities() {
    assert_eq!(
        argmax(&[0.1, 0.3, f32::NAN, 0.3, 0.2]),
        1,
        "ties to the lowest id"
    );
    assert_eq!(argmax(&[f32::NAN, 0.5]), 1, "NaN never wins");
    assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
    assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
    assert_eq!(argmax(&[f32::NEG_INFINITY, -1.0]), 1);
    assert_eq!(argmax(&[-0.0, 0.0]), 0, "−0 = +0: a tie");
    assert_eq!(argmax(&[0.0, 0.0, 0.0, 1e-45]), 3);
    assert_eq!(argmax(&[]), 0);
    assert_eq!(ScalarOps.argmax(&[0.2, 0.7, 0.1]), 1);
}

#[test]
fn race_keys() {
    assert_eq!(race_key(0.0, 5), -1.0);
    assert_eq!(race_key(-0.5, 5), -1.0);
    assert_eq!(race_key(f64::NAN, 5), -1.0);
    assert_eq!(race_key(2.0, 1 << 63), 2.0 / exponential(1 << 63));
    assert_eq!(race_key(2.0, 1 << 63).to_bits(), 0x4007_1547_652B_82FE);
    assert_eq!(race_key(f64::INFINITY, 0), f64::INFINITY);
    assert_eq!(race_key(1e-300, u64::MAX), 1e-300 / exponential(u64::MAX));
}

#[test]
fn race_rng_words_are_the_streams() {
    assert_eq!(RNG.words(5), race_words(7, 11, 2, 5));
    assert_eq!(RNG.words_lo(5), race_words_lo(7, 11, 2, 5));
    assert_eq!(RNG.words(0), race_words(7, 11, 2, 0));
    assert_ne!(RNG.words(5), RNG.words(6));
}

#[test]
fn races_with_no_candidate_or_one() {
    assert_eq!(race(RNG, 0, |_| 1.0), None);
    assert_eq!(race(RNG, 9, |_| 0.0), None);
    assert_eq!(race(RNG, 9, |_| f64::NAN), None);
    for v in 0..9 {
        let only = |i: usize| if i == v { 0.25 } else { 0.0 };
        assert_eq!(race(RNG, 9, only), Some(v as u32), "only {v} has weight");
    }
    // An id past `vocab` is never offered, even inside a group of four.
    assert_eq!(race(RNG, 5, |i| if i >= 5 { 1.0 } else { 0.0 }), None);
    // All nine weights positive: the winner is pinned (and stays in range).
    let row = [0.1f32, 0.2, 0.05, 0.15, 0.1, 0.1, 0.1, 0.1, 0.1];
    assert_eq!(race(RNG, 9, |i| f64::from(row[i])), Some(7));
    assert_eq!(ScalarOps.race(RNG, &row), Some(7));
    let mut wins = [0u32; 9];
    for seed in 0..64 {
        let rng = RaceRng { seed, ..RNG };
        wins[ScalarOps.race(rng, &row).unwrap() as usize] += 1;
    }
    assert_eq!(wins, [8, 12, 6, 11, 6, 3, 6, 5, 7], "winners over 64 seeds");
}

#[test]
fn residual_races() {
    let target = [0.5f32, 0.25, 0.25, 0.0, 0.0];
    let draft = [0.5f32, 0.5, 0.0, 0.0, 0.0];
    // Only id 2 has target > draft.
    assert_eq!(race_residual(RNG, &target, Some(&draft), 1), Some(2));
    assert_eq!(
        ScalarOps.race_residual(RNG, &target, Some(&draft), 1),
        Some(2)
    );
    // One-hot draft at 0: weights −0.5, ¼, ¼, 0, 0.
    let mut wins = [0u32; 5];
    for seed in 0..64 {
        let rng = RaceRng { seed, ..RNG };
        wins[race_residual(rng, &target, None, 0).unwrap() as usize] += 1;
    }
    assert_eq!(
        wins,
        [0, 36, 28, 0, 0],
        "one-hot at 0: winners over 64 seeds"
    );
    // One-hot at the only id with mass: no positive residual.
    assert_eq!(race_residual(RNG, &[1.0, 0.0], None, 0), None);
    assert_eq!(race_residual(RNG, &[0.0, 1.0], None, 0), Some(1));
    // Equal rows: no residual.
    assert_eq!(race_residual(RNG, &draft, Some(&draft), 0), None);
    assert_eq!(
        ScalarOps.entropy(&[0.5, 0.5]).to_bits(),
        0x3F31_7218,
        "ln 2"
    );
}

/// A random batch (seeded): B ≤ 3, k_max ≤ 3, V ≤ 9, with zeros, one-hot rows, NaN and
/// negative values (Check::Cheap uses them as given), with or without draft rows and
/// typical parameters.
struct Random {
    vocab: usize,
    k_max: usize,
    k: heapless::Vec<u32, 3>,
    ids: heapless::Vec<u32, 9>,
    draft: heapless::Vec<f32, 81>,
    target: heapless::Vec<f32, 108>,
    seed: heapless::Vec<u64, 3>,
    offset: heapless::Vec<u64, 3>,
    eps: heapless::Vec<f32, 3>,
    delta: heapless::Vec<f32, 3>,
    with_draft: bool,
    with_typical: bool,
}

fn value(g: &mut Mix) -> f32 {
    match g.below(16) {
        0..=3 => 0.0,
        4 => 1.0,
        5 => f32::NAN,
        6 => -0.25,
        _ => (g.below(1 << 24) as f32) / 16_777_216.0,
    }
}

impl Random {
    fn new(g: &mut Mix) -> Self {
        let vocab = 1 + g.below(9) as usize;
        let k_max = 1 + g.below(3) as usize;
        let b = 1 + g.below(3) as usize;
        let mut r = Random {
            vocab,
            k_max,
            k: heapless::Vec::new(),
            ids: heapless::Vec::new(),
            draft: heapless::Vec::new(),
            target: heapless::Vec::new(),
            seed: heapless::Vec::new(),
            offset: heapless::Vec::new(),
            eps: heapless::Vec::new(),
            delta: heapless::Vec::new(),
            with_draft: g.below(2) == 0,
            with_typical: g.below(2) == 0,
        };
        for _ in 0..b {
            r.k.push(1 + g.below(k_max as u64) as u32).unwrap();
            r.seed.push(g.next_u64()).unwrap();
            r.offset.push(g.next_u64()).unwrap();
            r.eps.push(g.below(50) as f32 / 100.0).unwrap();
            r.delta.push(g.below(50) as f32 / 100.0).unwrap();
            for _ in 0..k_max {
                r.ids.push(g.below(vocab as u64) as u32).unwrap();
                for _ in 0..vocab {
                    r.draft.push(value(g)).unwrap();
                }
            }
            for j in 0..=k_max {
                // Some target rows favour the draft token, so that tokens get accepted.
                let favour = j < k_max && g.below(2) == 0;
                let id = r.ids.get(r.ids.len() - k_max + j.min(k_max - 1)).copied();
                for v in 0..vocab {
                    let p = if favour && id == Some(v as u32) {
                        0.875
                    } else {
                        value(g)
                    };
                    r.target.push(p).unwrap();
                }
            }
        }
        r
    }

    fn batch(&self) -> Batch<'_> {
        let mut b = Batch::dense(
            Dims {
                vocab: self.vocab,
                k_max: self.k_max,
            },
            Drafts {
                k: &self.k,
                ids: &self.ids,
            },
            &self.target,
            Streams {
                seed: &self.seed,
                offset: &self.offset,
            },
        );
        if self.with_draft {
            b = b.with_draft_probs(&self.draft);
        }
        if self.with_typical {
            b = b.with_typical(&self.eps, &self.delta);
        }
        b
    }
}

/// 200 random batches × 3 methods through `verify_batch`; every output word and counter
/// pinned by one digest per method.
#[test]
#[cfg_attr(
    miri,
    ignore = "pure arithmetic, minutes under Miri; the boundary tests run"
)]
fn random_batches_are_pinned() {
    let mut digests = [0u64; 3];
    let mut accepted_total = [0u64; 3];
    for (m, method) in [Method::Rejection, Method::Greedy, Method::Typical]
        .into_iter()
        .enumerate()
    {
        let mut g = Mix(0x5EED);
        let mut h = Fnv::new();
        let mut counters = Counters::<3>::ZERO;
        for _ in 0..200 {
            let r = Random::new(&mut g);
            let batch = r.batch();
            let mut accepted = [0u32; 3];
            let mut tokens = [0u32; 12];
            let mut out = Outputs::new(
                specula_core::verify::AcceptedOut(&mut accepted[..batch.requests()]),
                specula_core::verify::TokensOut(&mut tokens[..batch.requests() * (r.k_max + 1)]),
            );
            verify_batch(method, Check::Cheap, &batch, &mut out, &mut counters).unwrap();
            let Outputs::Host {
                accepted, tokens, ..
            } = out
            else {
                panic!("host outputs")
            };
            for &a in accepted.iter() {
                h.add(u64::from(a));
            }
            for &t in tokens.iter() {
                assert!(t == SENTINEL || (t as usize) < r.vocab, "{t}");
                h.add(u64::from(t));
            }
        }
        accepted_total[m] = counters.accepted_tokens;
        h.add(counters.drafts);
        h.add(counters.draft_tokens);
        h.add(counters.accepted_tokens);
        h.add(counters.emitted_tokens);
        for i in 0..3 {
            h.add(counters.accepted_per_position[i]);
            h.add(counters.drafted_per_position[i]);
        }
        digests[m] = h.0;
    }
    assert_eq!(
        accepted_total,
        [366, 250, 456],
        "accepted tokens per method"
    );
    assert_eq!(
        digests,
        [
            3_401_053_452_593_991_705,
            6_814_457_254_986_222_090,
            16_314_651_700_834_559_048
        ],
        "rejection, greedy, typical"
    );
}

/// A plain request's stored rows are reduced by the caller's [`RowOps`] (a backend's vectorised
/// ones); a request with a filter goes through its processed rows and the plain loops instead.
#[test]
fn plain_requests_are_reduced_by_the_callers_ops() {
    struct Counting(core::cell::Cell<usize>);
    impl RowOps for Counting {
        fn argmax(&self, row: &[f32]) -> u32 {
            self.0.set(self.0.get() + 1);
            ScalarOps.argmax(row)
        }
        fn entropy(&self, row: &[f32]) -> f32 {
            ScalarOps.entropy(row)
        }
        fn race(&self, rng: RaceRng, row: &[f32]) -> Option<u32> {
            ScalarOps.race(rng, row)
        }
        fn race_residual(
            &self,
            rng: RaceRng,
            target: &[f32],
            draft: Option<&[f32]>,
            token: u32,
        ) -> Option<u32> {
            ScalarOps.race_residual(rng, target, draft, token)
        }
    }
    let target = [0.1, 0.6, 0.3, /* bonus row */ 0.0, 0.0, 1.0];
    let batch = Batch::dense(
        Dims { vocab: 3, k_max: 1 },
        Drafts { k: &[1], ids: &[1] },
        &target,
        Streams {
            seed: &[1],
            offset: &[0],
        },
    );
    let filters = [specula_core::verify::Filter::NONE.with_top_k(2)];
    for (batch, calls) in [(batch, 2), (batch.with_filters(&filters), 0)] {
        let ops = Counting(core::cell::Cell::new(0));
        let mut tokens = [0u32; 2];
        let accepted = verify_request(&ops, Method::Greedy, &batch, 0, &mut tokens);
        assert_eq!((accepted, tokens), (1, [1, 2]));
        assert_eq!(ops.0.get(), calls, "argmax calls through the ops");
    }
}

#[test]
fn one_request_by_hand() {
    // V = 4, k_max = 2, k = 2: the draft is [2, 1].
    let target = [
        0.1, 0.2, 0.6, 0.1, // row 0: argmax 2 (accepts 2)
        0.1, 0.2, 0.3, 0.4, // row 1: argmax 3 (rejects 1)
        0.0, 0.0, 0.0, 1.0, // row 2: bonus row
    ];
    let batch = Batch::dense(
        Dims { vocab: 4, k_max: 2 },
        Drafts {
            k: &[2],
            ids: &[2, 1],
        },
        &target,
        Streams {
            seed: &[42],
            offset: &[0],
        },
    );
    assert_eq!(batch.requests(), 1);
    let (mut accepted, mut tokens) = ([9u32; 1], [9u32; 3]);
    let mut counters = Counters::<2>::ZERO;
    let mut out = Outputs::new(
        specula_core::verify::AcceptedOut(&mut accepted),
        specula_core::verify::TokensOut(&mut tokens),
    );
    verify_batch(
        Method::Greedy,
        Check::STRICT,
        &batch,
        &mut out,
        &mut counters,
    )
    .unwrap();
    assert_eq!((accepted, tokens), ([1], [2, 3, SENTINEL]));
    assert_eq!(
        (
            counters.drafts,
            counters.accepted_tokens,
            counters.emitted_tokens
        ),
        (1, 1, 2)
    );
    // All accepted: the bonus token is row k's argmax.
    let batch = Batch::dense(
        Dims { vocab: 4, k_max: 2 },
        Drafts {
            k: &[2],
            ids: &[2, 3],
        },
        &target,
        Streams {
            seed: &[42],
            offset: &[0],
        },
    );
    let mut out = Outputs::new(
        specula_core::verify::AcceptedOut(&mut accepted),
        specula_core::verify::TokensOut(&mut tokens),
    );
    verify_batch(
        Method::Greedy,
        Check::STRICT,
        &batch,
        &mut out,
        &mut counters,
    )
    .unwrap();
    assert_eq!((accepted, tokens), ([2], [2, 3, 3]));
    assert_eq!(counters.accepted_per_position, [2, 1]);
    // A refused batch writes and counts nothing.
    let before = counters;
    let mut out = Outputs::new(
        specula_core::verify::AcceptedOut(&mut accepted),
        specula_core::verify::TokensOut(&mut tokens[..2]),
    );
    assert!(
        verify_batch(
            Method::Greedy,
            Check::Cheap,
            &batch,
            &mut out,
            &mut counters
        )
        .is_err()
    );
    assert_eq!(counters, before);
    assert_eq!((accepted, tokens), ([2], [2, 3, 3]));
}

/// Caller-supplied bonus tokens: emitted (in place of a sample of row `k`, which the ragged
/// layout then does not hold) by a request that accepts every draft, and never by one that
/// rejects, for every method, on stored rows and on logits.
#[test]
fn bonus_tokens_are_emitted_after_every_draft_is_accepted() {
    // Ragged, V = 3, no bonus rows: request 0 drafts [2, 0] (rows 0, 1), request 1 drafts [1]
    // (row 2). Each row is one-hot at its draft, except row 1 (one-hot at 1: rejects 0).
    let probs = [
        0.0, 0.0, 1.0, // request 0, position 0: accepts 2
        0.0, 1.0, 0.0, // request 0, position 1: rejects 0, emits 1
        0.0, 1.0, 0.0, // request 1, position 0: accepts 1, then the bonus
    ];
    let logits: std::vec::Vec<f32> = probs
        .iter()
        .map(|&p| if p > 0.0 { 0.0 } else { -1e30 })
        .collect();
    let temps = [1.0f32, 1.0];
    for method in [Method::Rejection, Method::Greedy, Method::Typical] {
        for with_logits in [false, true] {
            let batch = Batch::ragged(
                3,
                specula_core::verify::RaggedDrafts {
                    cu_num_draft_tokens: &[2, 3],
                    ids: &[2, 0, 1],
                },
                &probs,
                Streams {
                    seed: &[1, 2],
                    offset: &[0, 0],
                },
            )
            .with_bonus(&[0, 2]);
            let batch = if with_logits {
                batch.with_target_logits(Logits {
                    values: &logits,
                    temperature: &temps,
                })
            } else {
                batch
            };
            let (mut accepted, mut tokens) = ([9u32; 2], [9u32; 6]);
            let mut out = Outputs::new(
                specula_core::verify::AcceptedOut(&mut accepted),
                specula_core::verify::TokensOut(&mut tokens),
            );
            let mut counters = Counters::<2>::ZERO;
            verify_batch(method, Check::STRICT, &batch, &mut out, &mut counters).unwrap();
            let what = format!("{method:?} logits {with_logits}");
            assert_eq!((counters.drafts, counters.emitted_tokens), (2, 4), "{what}");
            assert_eq!(accepted, [1, 1], "{what}");
            assert_eq!(tokens, [2, 1, SENTINEL, 1, 2, SENTINEL], "{what}");
        }
    }
}

/// Typical acceptance's threshold `min(ε, δ·e^(−H))` with the given or default parameters, on
/// stored probabilities and on logits at `T = 1` whose softmax is the same row (the processed
/// path computes the threshold on its own).
#[test]
fn typical_uses_the_given_or_default_parameters() {
    assert_eq!((DEFAULT_EPS, DEFAULT_DELTA), (0.09, 0.3));
    // Uniform row over 4: H = ln 4, δ·e^(−H) = 0.3/4 = 0.075 < ε = 0.09: threshold 0.075.
    let target = [0.25f32; 8];
    // Equal logits: softmax 1/4 each, exactly.
    let logits = [0.0f32; 8];
    let run = |eps: &[f32], delta: &[f32], with_logits: bool| {
        let b = Batch::dense(
            Dims { vocab: 4, k_max: 1 },
            Drafts { k: &[1], ids: &[0] },
            &target,
            Streams {
                seed: &[1],
                offset: &[0],
            },
        );
        let b = if with_logits {
            b.with_target_logits(Logits {
                values: &logits,
                temperature: &[1.0],
            })
        } else {
            b
        };
        let b = if eps.is_empty() {
            b
        } else {
            b.with_typical(eps, delta)
        };
        let (mut accepted, mut tokens) = ([0u32; 1], [0u32; 2]);
        let mut c = Counters::<1>::ZERO;
        let mut out = Outputs::new(
            specula_core::verify::AcceptedOut(&mut accepted),
            specula_core::verify::TokensOut(&mut tokens),
        );
        verify_batch(Method::Typical, Check::Cheap, &b, &mut out, &mut c).unwrap();
        accepted[0]
    };
    // (ε, δ) given (empty: the defaults), the accepted count, and why.
    let cases: [(&[f32], &[f32], u32, &str); 5] = [
        (&[], &[], 1, "defaults: 0.25 > 0.075"),
        (&[0.3], &[1.1], 0, "min(0.3, 0.275) = 0.275"),
        (&[0.2], &[2.0], 1, "min(0.2, 0.5) = 0.2"),
        (&[0.25], &[2.0], 0, "0.25 is not above 0.25"),
        (&[0.5], &[0.9], 1, "min(0.5, 0.225) = 0.225"),
    ];
    for l in [false, true] {
        for (eps, delta, want, why) in cases {
            assert_eq!(run(eps, delta, l), want, "{why} (logits {l})");
        }
    }
}

#[test]
fn reference_verifier_counts_what_it_verifies() {
    let target = [0.5f32, 0.5, 0.5, 0.5];
    let batch = Batch::dense(
        Dims { vocab: 2, k_max: 1 },
        Drafts { k: &[1], ids: &[0] },
        &target,
        Streams {
            seed: &[3],
            offset: &[4],
        },
    );
    let mut v = Reference::<2>::new();
    assert_eq!(v.totals(), Ok(Counters::ZERO));
    let (mut accepted, mut tokens) = ([0u32; 1], [0u32; 2]);
    let mut out = Outputs::new(
        specula_core::verify::AcceptedOut(&mut accepted),
        specula_core::verify::TokensOut(&mut tokens),
    );
    v.verify(Method::Greedy, Check::Cheap, &batch, &mut out)
        .unwrap();
    v.verify(Method::Greedy, Check::Cheap, &batch, &mut out)
        .unwrap();
    let mut want = Counters::<2>::ZERO;
    want.record(1, 1).unwrap();
    want.record(1, 1).unwrap();
    assert_eq!(v.totals(), Ok(want));
    assert_eq!(v.counters, want);
    assert_eq!(Reference::<2>::default().counters, Counters::ZERO);
}
