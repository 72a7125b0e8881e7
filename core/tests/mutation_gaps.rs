//! Tests written to kill the surviving mutants of `scripts/mutants.sh` (issue 19): every test
//! here pins a value or a boundary that some mutation of the core changes. The known-answer bit
//! patterns were computed once by this implementation and are what every backend (the GPU
//! kernels included) must produce: a change here is a change of behaviour, not a test to update.
//!
//! Everything but the four digest sweeps runs under Miri too (`cargo +nightly miri test -p
//! specula-core --test mutation_gaps`): the sweeps are safe arithmetic and take minutes there.

use core::fmt::Write as _;
use specula_core::error_kind::ErrorKind;
use specula_core::metrics::{Cell32, Cell64, Words};
use specula_core::{CountError, Counters, SeqSlot, Snapshot};

/// `format!` without alloc: the core's tests stay `no_std`-shaped, and a buffer overflow fails.
fn fmt<T: core::fmt::Display>(v: &T) -> heapless::String<256> {
    let mut s = heapless::String::new();
    write!(s, "{v}").expect("fits 256 bytes");
    s
}

fn dbg<T: core::fmt::Debug>(v: &T) -> heapless::String<256> {
    let mut s = heapless::String::new();
    write!(s, "{v:?}").expect("fits 256 bytes");
    s
}

// ---------------------------------------------------------------------------------------------
// Slot and words
// ---------------------------------------------------------------------------------------------

#[test]
fn slot_handles_debug_show_the_version() {
    let mut slot = SeqSlot::new(5u64);
    assert_eq!(dbg(&slot), "SeqSlot { version: 0, .. }");
    {
        let (mut w, r) = slot.split();
        w.publish(&6);
        w.publish(&7);
        assert_eq!(dbg(&w), "SlotWriter { version: 2 }");
        assert_eq!(dbg(&r), "SlotReader { version: 2 }");
    }
    assert_eq!(dbg(&slot), "SeqSlot { version: 2, .. }");
}

#[test]
fn a_second_split_continues_the_versions() {
    let mut slot = SeqSlot::new(0u32);
    {
        let (mut w, _) = slot.split();
        assert_eq!(w.publish(&1), 1);
        assert_eq!(w.publish(&2), 2);
    }
    let (mut w, r) = slot.split();
    assert_eq!(w.version(), 2, "a new writer starts from the slot's stamp");
    assert_eq!(w.publish(&3), 3);
    assert_eq!(r.read(), (3, 3));
    assert_eq!(w.reader().read(), (3, 3));
}

#[test]
fn try_read_succeeds_on_a_quiet_slot() {
    let mut slot = SeqSlot::new([9u64, 8]);
    let (mut w, r) = slot.split();
    assert_eq!(
        r.try_read(0),
        Some(([9, 8], 0)),
        "0 attempts still tries once"
    );
    assert_eq!(r.try_read(1), Some(([9, 8], 0)));
    w.publish(&[1, 2]);
    assert_eq!(r.try_read(3), Some(([1, 2], 1)));
    assert_eq!(r.version(), 1);
}

#[test]
fn default_slot_holds_the_default_value() {
    let mut slot = SeqSlot::<Snapshot<2>>::default();
    let (mut w, r) = slot.split();
    assert_eq!(r.read(), (Snapshot::ZERO, 0));
    assert_eq!(w.version(), 0);
    let mut s = Snapshot::<2>::default();
    assert_eq!(s, Snapshot::ZERO);
    s.at_ns = 3;
    assert_eq!(w.publish(&s), 1);
    assert_eq!(r.read(), (s, 1));
}

#[test]
fn cells_hold_every_bit() {
    let c = Cell64::new(0xDEAD_BEEF_0123_4567);
    assert_eq!(c.load(), 0xDEAD_BEEF_0123_4567);
    c.store(u64::MAX);
    assert_eq!(c.load(), u64::MAX);
    assert_eq!(Cell64::default().load(), 0);
    let c = Cell32::new(0x89AB_CDEF);
    assert_eq!(c.load(), 0x89AB_CDEF);
    c.store(7);
    assert_eq!(c.load(), 7);
    assert_eq!(Cell32::default().load(), 0);
}

/// `to_storage`, `load` and `store` of every `Words` impl, with values no constant mutant
/// (0, 1, −1, default) can produce.
#[test]
fn every_words_impl_round_trips() {
    fn round_trip<T: Words + PartialEq + core::fmt::Debug>(initial: T, next: T) {
        let mut slot = SeqSlot::new(initial);
        let (mut w, r) = slot.split();
        assert_eq!(r.read(), (initial, 0), "to_storage and load");
        w.publish(&next);
        assert_eq!(r.read(), (next, 1), "store and load");
        let s = initial.to_storage();
        next.store(&s);
        assert_eq!(T::load(&s), next);
    }
    round_trip(0x1234_5678_9ABC_DEF0u64, u64::MAX - 2);
    round_trip(0x1234_5678u32, u32::MAX - 2);
    round_trip(-5i64, i64::MIN + 3);
    round_trip(-2.5f64, 1.0e300);
    round_trip([3u32, 4, 5], [6, 7, 8]);
    round_trip((11u64, 12u32), (13, 14));
    round_trip(((1u32, -2i64), [0.5f64; 2]), ((3, -4), [0.25, 8.0]));
    let mut c = Counters::<3>::ZERO;
    c.record(3, 2).unwrap();
    c.record(2, 1).unwrap();
    let mut d = c;
    d.record(1, 1).unwrap();
    round_trip(c, d);
    let s = Snapshot {
        counters: c,
        at_ns: 17,
        readback_errors: 4,
    };
    let t = Snapshot {
        counters: d,
        at_ns: 29,
        readback_errors: 5,
    };
    round_trip(s, t);
}

// ---------------------------------------------------------------------------------------------
// Error types: Display and Debug
// ---------------------------------------------------------------------------------------------

#[test]
fn count_errors_display() {
    assert_eq!(fmt(&CountError::EmptyDraft), "draft length k is 0");
    assert_eq!(
        fmt(&CountError::DraftTooLong { k: 9, max: 4 }),
        "draft length 9 exceeds maximum 4"
    );
    assert_eq!(
        fmt(&CountError::AcceptedExceedsDraft { accepted: 3, k: 2 }),
        "3 tokens accepted of a 2-token draft"
    );
    assert_eq!(
        dbg(&CountError::DraftTooLong { k: 9, max: 4 }),
        "DraftTooLong { k: 9, max: 4 }"
    );
}

#[test]
fn error_kinds_display_their_names() {
    let all = [
        (ErrorKind::NotCompiledIn, "not compiled in"),
        (ErrorKind::NoDriver, "no driver"),
        (ErrorKind::NoDevice, "no device"),
        (ErrorKind::NoCompiler, "no kernel compiler"),
        (ErrorKind::Compile, "kernel compilation failed"),
        (ErrorKind::InvalidInput, "invalid input"),
        (ErrorKind::Misuse, "misuse"),
        (ErrorKind::Device, "device failure"),
        (ErrorKind::Resource, "resource exhausted"),
    ];
    for (kind, name) in all {
        assert_eq!(kind.as_str(), name);
        assert_eq!(fmt(&kind), name);
    }
    assert_eq!(dbg(&ErrorKind::NoDevice), "NoDevice");
}

// ---------------------------------------------------------------------------------------------
// Clock
// ---------------------------------------------------------------------------------------------

#[test]
fn virtual_clock_moves_forward_only() {
    use specula_core::{Clock, VirtualClock};
    let c = VirtualClock::new(40);
    assert_eq!(c.now_ns(), 40);
    c.advance(2);
    assert_eq!(c.now_ns(), 42);
    c.set(100);
    assert_eq!(c.now_ns(), 100);
    c.set(50);
    assert_eq!(c.now_ns(), 100, "set never moves it back");
    let by_ref: &VirtualClock = &c;
    assert_eq!(Clock::now_ns(&by_ref), 100);
    c.advance(u64::MAX);
    assert_eq!(c.now_ns(), u64::MAX, "saturates");
    assert_eq!(VirtualClock::default().now_ns(), 0);
}

// ---------------------------------------------------------------------------------------------
// Validation (the core's own tests; the cross-crate conformance suite checks the backends)
// ---------------------------------------------------------------------------------------------

mod validation {
    use super::fmt;
    use specula_core::verify::{
        Batch, Check, Dims, Drafts, Layout, MAX_POSITIONS, Method, Outputs, Param, Rows, Streams,
        Target, Tensor, VerifyError, validate, validate_shape,
    };

    const V: usize = 4;
    const KM: usize = 2;
    const B: usize = 2;
    const METHODS: [Method; 3] = [Method::Rejection, Method::Greedy, Method::Typical];

    /// A valid batch: B = 2, k_max = 2, V = 4, k = [2, 1], every row [¼; 4] (sums exactly 1).
    struct Data {
        k: [u32; B],
        ids: [u32; B * KM],
        draft: [f32; B * KM * V],
        target: [f32; B * (KM + 1) * V],
        seed: [u64; B],
        offset: [u64; B],
        eps: [f32; B],
        delta: [f32; B],
        accepted: [u32; B],
        tokens: [u32; B * (KM + 1)],
    }

    impl Data {
        fn new() -> Self {
            Self {
                k: [2, 1],
                ids: [3, 2, 1, 0],
                draft: [0.25; B * KM * V],
                target: [0.25; B * (KM + 1) * V],
                seed: [1, 2],
                offset: [0, 5],
                eps: [0.09, 0.09],
                delta: [0.3, 0.3],
                accepted: [0; B],
                tokens: [0; B * (KM + 1)],
            }
        }
        fn batch(&self) -> Batch<'_> {
            Batch::dense(
                Dims {
                    vocab: V,
                    k_max: KM,
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
            )
            .with_draft_probs(&self.draft)
            .with_typical(&self.eps, &self.delta)
        }
        fn check(&mut self, method: Method, check: Check) -> Result<(), VerifyError> {
            let batch = Batch::dense(
                Dims {
                    vocab: V,
                    k_max: KM,
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
            )
            .with_draft_probs(&self.draft)
            .with_typical(&self.eps, &self.delta);
            let out = Outputs::new(
                specula_core::verify::AcceptedOut(&mut self.accepted),
                specula_core::verify::TokensOut(&mut self.tokens),
            );
            validate::<KM>(method, check, &batch, &out)
        }
        /// Every method under both checks.
        fn all(&mut self) -> [Result<(), VerifyError>; 6] {
            let strict = Check::Strict { sum_tolerance: 0.0 };
            let mut r = [Ok(()); 6];
            for (i, m) in METHODS.into_iter().enumerate() {
                r[2 * i] = self.check(m, Check::Cheap);
                r[2 * i + 1] = self.check(m, strict);
            }
            r
        }
    }

    fn shape(batch: &Batch<'_>, accepted: usize, tokens: usize) -> Result<(), VerifyError> {
        let mut a = [0u32; 8];
        let mut t = [0u32; 16];
        let out = Outputs::new(
            specula_core::verify::AcceptedOut(&mut a[..accepted]),
            specula_core::verify::TokensOut(&mut t[..tokens]),
        );
        validate_shape::<KM>(batch, &out)
    }

    #[test]
    fn a_valid_batch_passes_every_check() {
        assert_eq!(Data::new().all(), [Ok(()); 6]);
        // Strict with exact sums and zero tolerance; also the default tolerance.
        let mut d = Data::new();
        assert_eq!(d.check(Method::Rejection, Check::STRICT), Ok(()));
    }

    #[test]
    fn empty_batch_and_k_max_limits() {
        let d = Data::new();
        let b = d.batch();
        let empty = {
            let mut x = b;
            x.layout = Layout::Padded { k: &[] };
            x
        };
        assert_eq!(shape(&empty, 0, 0), Err(VerifyError::EmptyBatch));
        let zero = {
            let mut x = b;
            x.k_max = 0;
            x
        };
        assert_eq!(
            shape(&zero, B, 6),
            Err(VerifyError::KMaxOutOfRange { k_max: 0, max: KM })
        );
        let above = {
            let mut x = b;
            x.k_max = KM + 1;
            x
        };
        assert_eq!(
            shape(&above, B, 6),
            Err(VerifyError::KMaxOutOfRange {
                k_max: KM + 1,
                max: KM
            })
        );
        assert_eq!(shape(&b, B, 6), Ok(()), "k_max = K is allowed");
        // The RNG limit applies when K is larger.
        let mut a = [0u32; B];
        let mut t = [0u32; 6];
        let out = Outputs::new(
            specula_core::verify::AcceptedOut(&mut a),
            specula_core::verify::TokensOut(&mut t),
        );
        // (1 << 30) − 2: the last position j = k_max keeps `(j << 2) | stream` within 32 bits.
        assert_eq!(MAX_POSITIONS, 1_073_741_822);
        let rng = {
            let mut x = b;
            x.k_max = 1_073_741_823;
            x
        };
        assert_eq!(
            validate_shape::<{ usize::MAX }>(&rng, &out),
            Err(VerifyError::KMaxOutOfRange {
                k_max: 1_073_741_823,
                max: 1_073_741_822
            })
        );
        // At the limit itself the next problem is the length of draft_ids.
        let at = {
            let mut x = b;
            x.k_max = MAX_POSITIONS;
            x
        };
        assert_eq!(
            validate_shape::<{ usize::MAX }>(&at, &out),
            Err(VerifyError::Length {
                param: Param::DraftIds,
                len: B * KM,
                expected: B * MAX_POSITIONS
            })
        );
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn vocabulary_limit_is_u32_max() {
        let d = Data::new();
        let b = d.batch();
        let zero = {
            let mut x = b;
            x.vocab = 0;
            x
        };
        assert_eq!(
            shape(&zero, B, 6),
            Err(VerifyError::VocabOutOfRange { vocab: 0 })
        );
        let over = u32::MAX as usize + 1;
        let too_big = {
            let mut x = b;
            x.vocab = over;
            x.draft = x.draft.map(|d| Rows { stride: over, ..d });
            x.target = x.target.with_stride(over);
            x
        };
        assert_eq!(
            shape(&too_big, B, 6),
            Err(VerifyError::VocabOutOfRange { vocab: over })
        );
        // u32::MAX itself is a valid size (ids stay below the sentinel): the next check is the
        // draft rows' length.
        let max = u32::MAX as usize;
        let at_max = {
            let mut x = b;
            x.vocab = max;
            x.draft = x.draft.map(|d| Rows { stride: max, ..d });
            x.target = x.target.with_stride(max);
            x
        };
        assert_eq!(
            shape(&at_max, B, 6),
            Err(VerifyError::Length {
                param: Param::DraftProbs,
                len: B * KM * V,
                expected: B * KM * max
            })
        );
    }

    #[test]
    fn strides_at_and_below_the_vocabulary() {
        let d = Data::new();
        let b = d.batch();
        let draft = {
            let mut x = b;
            x.draft = x.draft.map(|d| Rows { stride: V - 1, ..d });
            x
        };
        assert_eq!(
            shape(&draft, B, 6),
            Err(VerifyError::StrideTooSmall {
                tensor: Tensor::Draft,
                stride: V - 1,
                vocab: V
            })
        );
        let target = {
            let mut x = b;
            x.target = x.target.with_stride(V - 1);
            x
        };
        assert_eq!(
            shape(&target, B, 6),
            Err(VerifyError::StrideTooSmall {
                tensor: Tensor::Target,
                stride: V - 1,
                vocab: V
            })
        );
        // Without draft probabilities the draft stride is ignored.
        let one_hot = {
            let mut x = b;
            x.draft = None;
            x.draft = x.draft.map(|d| Rows { stride: 0, ..d });
            x
        };
        assert_eq!(shape(&one_hot, B, 6), Ok(()));
        // Wider strides: the rows are padded.
        let wide_d = [0.25f32; B * KM * (V + 1)];
        let wide_t = [0.25f32; B * (KM + 1) * (V + 2)];
        let wide = {
            let mut x = b;
            x.draft = Some(Rows::f32(&wide_d, x.draft.map_or(x.vocab, |d| d.stride)));
            x.draft = x.draft.map(|d| Rows { stride: V + 1, ..d });
            x.target = Target::Probs(Rows::f32(&wide_t, x.target.rows().stride));
            x.target = x.target.with_stride(V + 2);
            x
        };
        assert_eq!(shape(&wide, B, 6), Ok(()));
    }

    #[test]
    fn every_length_is_checked() {
        let d = Data::new();
        let b = d.batch();
        let len = |param, len, expected| {
            Err(VerifyError::Length {
                param,
                len,
                expected,
            })
        };
        assert_eq!(
            shape(
                &{
                    let mut x = b;
                    x.draft_ids = &d.ids[..3];
                    x
                },
                B,
                6
            ),
            len(Param::DraftIds, 3, 4)
        );
        assert_eq!(
            shape(
                &{
                    let mut x = b;
                    x.draft = Some(Rows::f32(
                        &d.draft[..15],
                        x.draft.map_or(x.vocab, |d| d.stride),
                    ));
                    x
                },
                B,
                6
            ),
            len(Param::DraftProbs, 15, 16)
        );
        assert_eq!(
            shape(
                &{
                    let mut x = b;
                    x.target = Target::Probs(Rows::f32(&d.target[..23], x.target.rows().stride));
                    x
                },
                B,
                6
            ),
            len(Param::TargetProbs, 23, 24)
        );
        assert_eq!(
            shape(
                &{
                    let mut x = b;
                    x.seed = &d.seed[..1];
                    x
                },
                B,
                6
            ),
            len(Param::Seed, 1, 2)
        );
        assert_eq!(
            shape(
                &{
                    let mut x = b;
                    x.offset = &[0, 0, 0];
                    x
                },
                B,
                6
            ),
            len(Param::Offset, 3, 2)
        );
        assert_eq!(
            shape(
                &{
                    let mut x = b;
                    x.eps = Some(&[0.1]);
                    x
                },
                B,
                6
            ),
            len(Param::Eps, 1, 2)
        );
        assert_eq!(
            shape(
                &{
                    let mut x = b;
                    x.delta = Some(&[0.1]);
                    x
                },
                B,
                6
            ),
            len(Param::Delta, 1, 2)
        );
        assert_eq!(shape(&b, 1, 6), len(Param::Accepted, 1, 2));
        assert_eq!(shape(&b, B, 7), len(Param::Tokens, 7, 6));
        // A layout size that overflows can never match: expected is usize::MAX.
        assert_eq!(
            shape(
                &{
                    let mut x = b;
                    x.target = x.target.with_stride(usize::MAX);
                    x
                },
                B,
                6
            ),
            len(Param::TargetProbs, 24, usize::MAX)
        );
        assert_eq!(
            shape(
                &{
                    let mut x = b;
                    x.draft = x.draft.map(|d| Rows {
                        stride: usize::MAX,
                        ..d
                    });
                    x
                },
                B,
                6
            ),
            len(Param::DraftProbs, 16, usize::MAX)
        );
    }

    #[test]
    fn draft_lengths_of_each_request() {
        let mut d = Data::new();
        d.k = [2, 0];
        let e = VerifyError::DraftLength {
            request: 1,
            k: 0,
            k_max: KM,
        };
        assert_eq!(d.all(), [Err(e); 6]);
        d.k = [2, 3];
        let e = VerifyError::DraftLength {
            request: 1,
            k: 3,
            k_max: KM,
        };
        assert_eq!(d.all(), [Err(e); 6]);
        d.k = [2, 2];
        assert_eq!(d.all(), [Ok(()); 6]);
    }

    #[test]
    fn token_ids_below_the_vocabulary() {
        let mut d = Data::new();
        d.k = [2, 2];
        d.ids = [3, 3, 3, 4];
        let e = VerifyError::TokenOutOfRange {
            request: 1,
            position: 1,
            token: 4,
            vocab: V,
        };
        assert_eq!(d.all(), [Err(e); 6]);
        // An id in a padding slot (position ≥ k) is never read, so never checked.
        d.k = [2, 1];
        assert_eq!(d.all(), [Ok(()); 6]);
        d.ids = [3, 9, 0, 0];
        let e = VerifyError::TokenOutOfRange {
            request: 0,
            position: 1,
            token: 9,
            vocab: V,
        };
        assert_eq!(d.all(), [Err(e); 6]);
    }

    #[test]
    fn typical_parameters_only_for_typical() {
        for (bad, param) in [
            (f32::NAN, Param::Eps),
            (-0.5, Param::Eps),
            (f32::INFINITY, Param::Delta),
            (-1e-30, Param::Delta),
        ] {
            let mut d = Data::new();
            if param == Param::Eps {
                d.eps[1] = bad;
            } else {
                d.delta[1] = bad;
            }
            let e = VerifyError::BadParam { request: 1, param };
            assert_eq!(d.check(Method::Typical, Check::Cheap), Err(e), "{bad}");
            assert_eq!(d.check(Method::Greedy, Check::Cheap), Ok(()));
            assert_eq!(d.check(Method::Rejection, Check::Cheap), Ok(()));
        }
        let mut d = Data::new();
        d.eps = [0.0, f32::MAX];
        d.delta = [0.0, 1e30];
        assert_eq!(
            d.check(Method::Typical, Check::Cheap),
            Ok(()),
            "0 and large are fine"
        );
    }

    #[test]
    fn strict_refuses_bad_values_and_only_strict_does() {
        for bad in [f32::NAN, -1e-30, f32::INFINITY, f32::NEG_INFINITY] {
            let mut d = Data::new();
            d.target[(KM + 1) * V + 2] = bad; // request 1, target row 0, index 2
            let e = VerifyError::BadProbability {
                request: 1,
                tensor: Tensor::Target,
                position: 0,
                index: 2,
            };
            for m in METHODS {
                assert_eq!(d.check(m, Check::Cheap), Ok(()));
                assert_eq!(d.check(m, Check::STRICT), Err(e), "{bad}");
            }
        }
        // −0.0 is a probability of zero.
        let mut d = Data::new();
        d.target[0] = -0.0;
        d.target[1] = 0.5;
        assert_eq!(d.check(Method::Greedy, Check::STRICT), Ok(()));
    }

    #[test]
    fn strict_row_sums_too_low_too_high_and_at_the_tolerance() {
        let tol = |t| Check::Strict { sum_tolerance: t };
        // Request 0, target row 1: [¼, ¼, ¼, ⅛] sums to 0.875 (too low).
        let mut d = Data::new();
        d.target[V + 3] = 0.125;
        let low = VerifyError::RowSum {
            request: 0,
            tensor: Tensor::Target,
            position: 1,
            sum: 0.875,
        };
        assert_eq!(d.check(Method::Greedy, Check::STRICT), Err(low));
        assert_eq!(
            d.check(Method::Greedy, tol(0.125)),
            Ok(()),
            "|dev| = tol passes"
        );
        assert_eq!(d.check(Method::Greedy, tol(0.124)), Err(low));
        // [¼, ¼, ¼, ⅜] sums to 1.125 (too high).
        d.target[V + 3] = 0.375;
        let high = VerifyError::RowSum {
            request: 0,
            tensor: Tensor::Target,
            position: 1,
            sum: 1.125,
        };
        assert_eq!(d.check(Method::Greedy, Check::STRICT), Err(high));
        assert_eq!(d.check(Method::Greedy, tol(0.125)), Ok(()));
        assert_eq!(d.check(Method::Greedy, tol(0.124)), Err(high));
        // A NaN tolerance fails every row, even exact ones.
        let mut d = Data::new();
        assert_eq!(
            d.check(Method::Greedy, tol(f32::NAN)),
            Err(VerifyError::RowSum {
                request: 0,
                tensor: Tensor::Draft,
                position: 0,
                sum: 1.0
            })
        );
    }

    #[test]
    fn strict_checks_exactly_the_rows_a_method_reads() {
        let strict = Check::Strict { sum_tolerance: 0.0 };
        // Request 1 has k = 1: draft row 0 and target rows 0 and 1 are read; draft row 1 and
        // target row 2 are padding.
        let base = (KM + 1) * V; // request 1's first target value
        let dbase = KM * V; // request 1's first draft value
        let mut d = Data::new();
        d.draft[dbase + V] = 9.0; // draft row 1: padding
        d.target[base + 2 * V] = 9.0; // target row 2: padding
        assert_eq!(d.check(Method::Rejection, strict), Ok(()));
        d.draft[dbase + 1] = 0.5; // draft row 0 (read): sums to 1.25
        assert_eq!(
            d.check(Method::Rejection, strict),
            Err(VerifyError::RowSum {
                request: 1,
                tensor: Tensor::Draft,
                position: 0,
                sum: 1.25
            })
        );
        let mut d = Data::new();
        d.target[base + V] = 0.5; // target row k = 1 (the bonus row, read)
        assert_eq!(
            d.check(Method::Greedy, strict),
            Err(VerifyError::RowSum {
                request: 1,
                tensor: Tensor::Target,
                position: 1,
                sum: 1.25
            })
        );
        // Draft rows are checked before target rows, and not at all for a one-hot drafter.
        d.draft[dbase] = 0.0;
        assert_eq!(
            d.check(Method::Greedy, strict),
            Err(VerifyError::RowSum {
                request: 1,
                tensor: Tensor::Draft,
                position: 0,
                sum: 0.75
            })
        );
        let mut a = [0u32; B];
        let mut t = [0u32; 6];
        let out = Outputs::new(
            specula_core::verify::AcceptedOut(&mut a),
            specula_core::verify::TokensOut(&mut t),
        );
        let one_hot = {
            let mut x = d.batch();
            x.draft = None;
            x
        };
        assert_eq!(
            validate::<KM>(Method::Greedy, strict, &one_hot, &out),
            Err(VerifyError::RowSum {
                request: 1,
                tensor: Tensor::Target,
                position: 1,
                sum: 1.25
            })
        );
    }

    #[test]
    fn verify_errors_display() {
        let cases: [(VerifyError, &str); 10] = [
            (VerifyError::EmptyBatch, "empty batch"),
            (
                VerifyError::KMaxOutOfRange { k_max: 0, max: 4 },
                "k_max 0 is outside 1..=4",
            ),
            (
                VerifyError::VocabOutOfRange { vocab: 0 },
                "vocabulary size 0 out of range",
            ),
            (
                VerifyError::StrideTooSmall {
                    tensor: Tensor::Draft,
                    stride: 3,
                    vocab: 4,
                },
                "Draft row stride 3 is below the vocabulary size 4",
            ),
            (
                VerifyError::Length {
                    param: Param::Seed,
                    len: 1,
                    expected: 2,
                },
                "Seed has 1 values, the layout needs 2",
            ),
            (
                VerifyError::DraftLength {
                    request: 1,
                    k: 5,
                    k_max: 4,
                },
                "request 1: draft length 5 is outside 1..=4",
            ),
            (
                VerifyError::TokenOutOfRange {
                    request: 0,
                    position: 2,
                    token: 7,
                    vocab: 4,
                },
                "request 0, position 2: token 7 is not below vocabulary size 4",
            ),
            (
                VerifyError::BadParam {
                    request: 3,
                    param: Param::Eps,
                },
                "request 3: Eps is not finite and non-negative",
            ),
            (
                VerifyError::BadProbability {
                    request: 0,
                    tensor: Tensor::Target,
                    position: 1,
                    index: 2,
                },
                "request 0, Target row 1, index 2: probability is not finite and non-negative",
            ),
            (
                VerifyError::RowSum {
                    request: 0,
                    tensor: Tensor::Target,
                    position: 1,
                    sum: 0.875,
                },
                "request 0, Target row 1 sums to 0.875, not 1",
            ),
        ];
        for (e, text) in cases {
            assert_eq!(fmt(&e), text);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Known answers of the portable numerics (the GPU kernels must give the same bits)
// ---------------------------------------------------------------------------------------------

/// FNV-1a over 64-bit words: one number that pins thousands of results.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
    fn add(&mut self, v: u64) {
        for b in v.to_le_bytes() {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// splitmix64: the test inputs' generator.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

mod fmath_known_answers {
    use super::Fnv;
    use specula_core::verify::fmath::{entropy, entropy_from_fixed, entropy_term, exp_p, ln_p};

    fn ln_bits(x_bits: u32) -> u32 {
        ln_p(f32::from_bits(x_bits)).to_bits()
    }

    #[test]
    fn ln_at_the_mantissa_fold() {
        // The mantissa exactly √2 (rounded) is not folded (`m > SQRT_2`); one ulp above is.
        assert_eq!(ln_bits(0x3FB5_04F3), 0x3EB1_7218, "ln_p(√2)");
        assert_eq!(ln_bits(0x3FB5_04F2), 0x3EB1_7215);
        assert_eq!(ln_bits(0x3FB5_04F4), 0x3EB1_7219);
        assert_eq!(ln_bits(0x3F35_04F3), 0xBEB1_7218, "ln_p(√2 / 2)");
        // The largest |s| of the series, where the C7 term's sign shows in the last bit.
        assert_eq!(ln_p(1.414_062_5).to_bits(), 0x3EB1_6418);
        assert_eq!(ln_bits(0x3FC0_0000), 0x3ECF_9920, "ln_p(1.5)");
        assert_eq!(ln_bits(0x3F40_0000), 0xBE93_4B10, "ln_p(0.75)");
        assert_eq!(ln_bits(0x4000_0000), 0x3F31_7218, "ln_p(2)");
        // The ends of the normal range.
        assert_eq!(ln_bits(0x0080_0000), 0xC2AE_AC50, "ln_p(MIN_POSITIVE)");
        assert_eq!(ln_bits(0x7F7F_FFFF), 0x42B1_7218, "ln_p(MAX)");
        assert_eq!(ln_bits(0x0DA2_4260), 0xC28A_27B5, "ln_p(1e-30)");
        assert_eq!(ln_bits(0x7217_7617), 0x428C_5A32, "ln_p(3e30)");
    }

    #[test]
    fn exp_at_its_boundaries() {
        let exp_bits = |x: f32| exp_p(x).to_bits();
        // x = 88 is the last input that is not +∞: e⁸⁸ ≈ 1.65e38 is finite.
        assert_eq!(exp_bits(88.0), 0x7EF8_82B7);
        assert_eq!(exp_bits(87.99), 0x7EF6_0990);
        assert_eq!(
            exp_bits(f32::from_bits(0x42B0_0001)),
            0x7F80_0000,
            "just above 88"
        );
        // Just above −87: n = −126, the smallest normal scale, not flushed to 0.
        assert_eq!(exp_bits(f32::from_bits(0xC2AD_FFFF)), 0x00B3_36E0);
        assert_eq!(exp_bits(-86.99), 0x00B5_03B6);
        assert_eq!(exp_bits(-86.5), 0x0113_BC74);
        assert_eq!(exp_bits(-87.0), 0);
        // The largest reduced arguments |r| ≈ ln2/2, on both sides of the rounding of n.
        assert_eq!(exp_bits(0.3466), 0x3FB5_062E);
        assert_eq!(exp_bits(-0.3466), 0x3F35_03B9);
        assert_eq!(exp_bits(f32::from_bits(0x3EB1_7218)), 0x3FB5_04F5);
        assert_eq!(exp_bits(f32::from_bits(0xBEB1_7218)), 0x3F35_04F2);
        assert_eq!(exp_bits(1.039_720_7), 0x4035_04F1);
        assert_eq!(exp_bits(0.5), 0x3FD3_094C);
        assert_eq!(exp_bits(-0.5), 0x3F1B_4598);
        assert_eq!(exp_bits(10.0), 0x46AC_14EE);
        assert_eq!(exp_bits(-10.0), 0x383E_6BCE);
        assert_eq!(exp_bits(50.0), 0x638C_881F);
        assert_eq!(exp_bits(0.0), 0x3F80_0000);
        assert_eq!(exp_bits(-0.0), 0x3F80_0000);
    }

    /// Every result bit of 4096 + 2048 `ln_p` and 4096 `exp_p` inputs spread over their ranges.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "pure arithmetic, minutes under Miri; the boundary tests run"
    )]
    fn ln_and_exp_sweeps() {
        let mut h = Fnv::new();
        let (lo, hi) = (0x0080_0000u32, 0x7F7F_FFFFu32);
        for i in 0..4096u32 {
            h.add(u64::from(ln_bits(lo + (hi - lo) / 4096 * i)));
        }
        // Densely around 1, where the series does all the work.
        let (lo, hi) = (0x3F35_04F3u32, 0x3FB5_04F3u32);
        for i in 0..2048u32 {
            h.add(u64::from(ln_bits(lo + (hi - lo) / 2048 * i)));
        }
        assert_eq!(h.0, 7_507_939_885_867_699_002, "ln_p sweep");
        let mut h = Fnv::new();
        for i in 0..4096u32 {
            let x = -87.5f32 + i as f32 * (176.0 / 4096.0);
            h.add(u64::from(exp_p(x).to_bits()));
        }
        assert_eq!(h.0, 13_565_997_445_163_094_477, "exp_p sweep");
    }

    #[test]
    fn entropy_known_answers() {
        assert_eq!(entropy_term(0.5), 381_061_693_440);
        assert_eq!(entropy_term(1.0), 0);
        assert_eq!(entropy_term(f32::MIN_POSITIVE), 0);
        assert_eq!(entropy_term(f32::from_bits(0x007F_FFFF)), 0, "subnormal");
        assert_eq!(entropy_term(-0.5), 0);
        assert_eq!(entropy_from_fixed(1 << 40).to_bits(), 1.0f32.to_bits());
        assert_eq!(
            entropy_from_fixed(-(3 << 39)).to_bits(),
            (-1.5f32).to_bits()
        );
        let row = [0.5f32, 0.25, 0.125, 0.125];
        assert_eq!(entropy(&row).to_bits(), 0x3F9B_43D5);
    }
}

mod philox_known_answers {
    use super::Fnv;
    use specula_core::verify::philox::{
        STREAM_ACCEPT, STREAM_RACE, STREAM_RACE_LO, accept_draw, counter, key, philox4x32_10,
        race_words, race_words_lo, uniform_co,
    };

    /// The same coordinates `specula-tests`' value-stability test pins for every backend.
    #[test]
    fn stream_words_at_fixed_coordinates() {
        assert_eq!(
            race_words(7, 11, 2, 5),
            [0x7be1_714c, 0xe6d0_6a4c, 0x06bb_ca6f, 0xce82_d299]
        );
        assert_eq!(
            race_words_lo(7, 11, 2, 5),
            [0x4e2f_279f, 0xebf1_efce, 0xab8c_3b15, 0x6eee_6207]
        );
        assert_eq!(accept_draw(u64::MAX, 1 << 40, 3), 0x566f_e672_80e8_3f5d);
        assert_eq!(
            (STREAM_ACCEPT, STREAM_RACE, STREAM_RACE_LO),
            (0, 1, 2),
            "the stream numbers are part of the counter layout"
        );
    }

    #[test]
    fn counter_and_key_use_every_bit() {
        assert_eq!(key(u64::MAX), [u32::MAX, u32::MAX]);
        assert_eq!(key(1 << 32), [0, 1]);
        assert_eq!(
            counter(u32::MAX, (1 << 30) - 1, 3, u64::MAX),
            [u32::MAX, u32::MAX, u32::MAX, u32::MAX]
        );
        assert_eq!(counter(0, 1, 0, 1 << 32), [0, 4, 0, 1]);
        assert_eq!(uniform_co(0x0000_0100), f32::from_bits(0x3380_0000), "2⁻²⁴");
        assert_eq!(uniform_co(0x1234_5678), 0x12_3456 as f32 / 16_777_216.0);
    }

    /// 256 blocks with every counter and key word varying, pinned by digest.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "pure arithmetic, minutes under Miri; the boundary tests run"
    )]
    fn philox_sweep() {
        let mut h = Fnv::new();
        let mut x = 0x0123_4567u32;
        for _ in 0..256 {
            let mut w = [0u32; 6];
            for v in &mut w {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                *v = x;
            }
            let out = philox4x32_10([w[0], w[1], w[2], w[3]], [w[4], w[5]]);
            for o in out {
                h.add(u64::from(o));
            }
        }
        assert_eq!(h.0, 8_088_776_234_842_338_135, "philox sweep");
    }
}

mod exponential_known_answers {
    use super::Fnv;
    use specula_core::verify::exponential::{
        accepts, draw, exponential, exponential_floor, uniform53,
    };

    fn e(x: u64) -> u64 {
        exponential(x).to_bits()
    }

    #[test]
    fn at_the_branch_and_the_fold() {
        // v = ¼ exactly is the first draw of the logarithm branch.
        assert_eq!(e((1 << 62) - 1), 0x3FD2_6962_1134_DB92);
        assert_eq!(e(1 << 62), 0x3FD2_6962_1134_DB92);
        // u = 1 − v with its mantissa exactly √2 (rounded) is not folded; one cell off is.
        let n = (core::f64::consts::SQRT_2 * 9_223_372_036_854_775_808.0) as u64;
        assert_eq!(n, 0xB504_F333_F9DE_6800);
        assert_eq!(e(!n), 0x3FD6_2E42_FEFA_39ED);
        assert_eq!(e(!n - 4096), 0x3FD6_2E42_FEFA_39E8);
        assert_eq!(e(!n + 4096), 0x3FD6_2E42_FEFA_39F4);
        // The ends, and halfway.
        assert_eq!(e(0), 0x3BE0_0000_0000_0000);
        assert_eq!(e(1), 0x3BF8_0000_0000_0000, "1.5 · 2⁻⁶⁴");
        assert_eq!(e(u64::MAX), 0x4046_86FC_0AF6_22D7, "45.05");
        assert_eq!(e(1 << 63), 0x3FE6_2E42_FEFA_39EF, "ln 2");
        assert_eq!(e(0xC000_0000_0000_0000), 0x3FF6_2E42_FEFA_39EF, "ln 4");
    }

    /// 4096 draws over the whole range plus 64 near each end and the branch, pinned by digest.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "pure arithmetic, minutes under Miri; the boundary tests run"
    )]
    fn exponential_sweep() {
        let mut h = Fnv::new();
        for i in 0..4096u64 {
            h.add(e(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        }
        for i in 0..64u64 {
            h.add(e(1 << i));
            h.add(e(u64::MAX - (1 << i)));
            h.add(e((1 << 62) + i * 0x1_0000_0001));
            h.add(e((1 << 62) - 1 - i * 0x1_0000_0001));
        }
        assert_eq!(h.0, 2_459_743_973_946_944_459, "exponential sweep");
    }

    #[test]
    fn draws_floors_and_uniforms() {
        assert_eq!(draw(0x1234_5678, 0x9ABC_DEF0), 0x1234_5678_9ABC_DEF0);
        assert_eq!(draw(u32::MAX, 0), 0xFFFF_FFFF_0000_0000);
        assert_eq!(exponential_floor(0x8000_0000), 0.5);
        assert_eq!(exponential_floor(0x0000_01FF), f32::from_bits(0x3380_0000));
        assert_eq!(exponential_floor(u32::MAX), 1.0 - f32::EPSILON / 2.0);
        assert_eq!(
            uniform53(0x0000_0000_0000_0800),
            1.0 / 9_007_199_254_740_992.0
        );
        assert_eq!(
            uniform53(0x0000_0000_0000_1000),
            3.0 / 9_007_199_254_740_992.0
        );
        // U·pd < pt at the boundary: U = ½ + 2⁻⁵³.
        let half = 1u64 << 63;
        assert!(!accepts(half, 0.5, 1.0));
        assert!(accepts(half, 0.500_001, 1.0));
        assert!(accepts(half, 0.5, 0.999_99));
        assert!(!accepts(half, 0.25, 0.5));
        assert!(!accepts(0, 0.0, 1.0), "pt = 0 never accepts");
    }
}

// ---------------------------------------------------------------------------------------------
// The reference verifier: row reductions and whole batches
// ---------------------------------------------------------------------------------------------

mod reference_known_answers {
    use super::{Fnv, Mix};
    use specula_core::Counters;
    use specula_core::verify::exponential::exponential;
    use specula_core::verify::philox::{race_words, race_words_lo};
    use specula_core::verify::{
        Batch, Check, DEFAULT_DELTA, DEFAULT_EPS, Dims, Drafts, Method, Outputs, RaceRng,
        Reference, RowOps, SENTINEL, ScalarOps, Streams, Verifier, argmax, race, race_key,
        race_residual, verify_batch,
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
                r.seed.push(g.next()).unwrap();
                r.offset.push(g.next()).unwrap();
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
                    specula_core::verify::TokensOut(
                        &mut tokens[..batch.requests() * (r.k_max + 1)],
                    ),
                );
                verify_batch(method, Check::Cheap, &batch, &mut out, &mut counters).unwrap();
                for &a in out.accepted.iter() {
                    h.add(u64::from(a));
                }
                for &t in out.tokens.iter() {
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

    #[test]
    fn typical_uses_the_given_or_default_parameters() {
        assert_eq!((DEFAULT_EPS, DEFAULT_DELTA), (0.09, 0.3));
        // Uniform row over 4: H = ln 4, δ·e^(−H) = 0.3/4 = 0.075 < ε = 0.09: threshold 0.075.
        let target = [0.25f32; 8];
        let run = |eps: &[f32], delta: &[f32]| {
            let b = Batch::dense(
                Dims { vocab: 4, k_max: 1 },
                Drafts { k: &[1], ids: &[0] },
                &target,
                Streams {
                    seed: &[1],
                    offset: &[0],
                },
            );
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
        assert_eq!(run(&[], &[]), 1, "defaults: 0.25 > 0.075");
        assert_eq!(run(&[0.3], &[1.1]), 0, "threshold min(0.3, 0.275) = 0.275");
        assert_eq!(run(&[0.2], &[2.0]), 1, "threshold min(0.2, 0.5) = 0.2");
        assert_eq!(run(&[0.25], &[2.0]), 0, "0.25 is not above 0.25");
        assert_eq!(run(&[0.5], &[0.9]), 1, "threshold min(0.5, 0.225) = 0.225");
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
}

// ---------------------------------------------------------------------------------------------
// Kernel launch contract and derived metrics
// ---------------------------------------------------------------------------------------------

mod kernel_contract {
    use specula_core::Counters;
    use specula_core::gpu::kernels::{
        FLAG_DRAFT_PROBS, SHAPE_WORDS, ShapeTooLarge, batch_shape, counters_from_stats, error_word,
        method_code, shape_words, stats_words, tree_draft_tokens_word, tree_drafts_word,
    };
    use specula_core::verify::{Batch, Dims, Drafts, Method, Rows, Streams};

    #[test]
    fn method_codes_and_shape_words() {
        assert_eq!(
            [Method::Rejection, Method::Greedy, Method::Typical].map(method_code),
            [0, 1, 2]
        );
        assert_eq!(
            shape_words(3, 4, 5, Some(6), 7, 2, 9),
            [3, 4, 5, 6, 7, 2, 9, FLAG_DRAFT_PROBS]
        );
        assert_eq!(
            shape_words(3, 4, 5, None, 7, 1, 9),
            [3, 4, 5, 0, 7, 1, 9, 0]
        );
        assert_eq!(SHAPE_WORDS, 8);
    }

    #[test]
    fn batch_shapes_and_their_limits() {
        let target = [0.0f32; 3 * 2 * 6];
        let draft = [0.0f32; 3 * 5];
        let b = Batch::dense(
            Dims { vocab: 5, k_max: 1 },
            Drafts {
                k: &[1, 1, 1],
                ids: &[0, 0, 0],
            },
            &target,
            Streams {
                seed: &[0; 3],
                offset: &[0; 3],
            },
        );
        let b = {
            let mut x = b;
            x.target = x.target.with_stride(6);
            x
        };
        assert_eq!(
            batch_shape::<4>(Method::Typical, &b),
            Ok([3, 1, 5, 0, 6, 2, 4, 0])
        );
        let with = b.with_draft_probs(&draft);
        assert_eq!(
            batch_shape::<4>(Method::Greedy, &with),
            Ok([3, 1, 5, 5, 6, 1, 4, FLAG_DRAFT_PROBS])
        );
        assert_eq!(
            batch_shape::<{ u32::MAX as usize }>(Method::Greedy, &b).map(|s| s[6]),
            Ok(u32::MAX)
        );
        #[cfg(target_pointer_width = "64")]
        {
            let big = u32::MAX as usize + 1;
            assert_eq!(
                batch_shape::<{ u32::MAX as usize + 1 }>(Method::Greedy, &b),
                Err(ShapeTooLarge)
            );
            for wide in [
                {
                    let mut x = b;
                    x.vocab = big;
                    x
                },
                {
                    let mut x = b;
                    x.k_max = big;
                    x
                },
                {
                    let mut x = b;
                    x.target = x.target.with_stride(big);
                    x
                },
                {
                    let mut x = with;
                    x.draft = x.draft.map(|d| Rows { stride: big, ..d });
                    x
                },
            ] {
                assert_eq!(batch_shape::<4>(Method::Greedy, &wide), Err(ShapeTooLarge));
            }
            // A draft stride is not part of the shape without draft probabilities.
            let ignored = {
                let mut x = b;
                x.draft = x.draft.map(|d| Rows { stride: big, ..d });
                x
            };
            assert!(batch_shape::<4>(Method::Greedy, &ignored).is_ok());
        }
    }

    #[test]
    fn stats_layout() {
        assert_eq!((stats_words(0), error_word(0)), (7, 4));
        assert_eq!((stats_words(3), error_word(3)), (13, 10));
        assert_eq!((tree_drafts_word(3), tree_draft_tokens_word(3)), (11, 12));
        let stats: [u64; 11] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];
        let mut want = Counters::<2>::ZERO;
        want.drafts = 1;
        want.draft_tokens = 2;
        want.accepted_tokens = 3;
        want.emitted_tokens = 4;
        want.accepted_per_position = [5, 6];
        want.drafted_per_position = [7, 8];
        want.tree_drafts = 10;
        want.tree_draft_tokens = 11;
        assert_eq!(
            counters_from_stats::<2>(&stats),
            Some(want),
            "9 is the flag word"
        );
        assert_eq!(counters_from_stats::<2>(&stats[..10]), None);
        assert_eq!(
            counters_from_stats::<0>(&stats[..7]).map(|c| (c.drafts, c.tree_draft_tokens)),
            Some((1, 7))
        );
    }
}

mod derived_metrics {
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
}
