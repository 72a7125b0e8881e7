//! Validation of a verification batch: what is refused, with which typed error, and that
//! nothing is written or counted on a refusal (the cross-crate conformance suite checks the
//! backends against the same reference).

use crate::support::fmt;
use specula_core::verify::Draft;
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
        x.draft = x.draft.map(|d| Draft {
            rows: Rows {
                stride: over,
                ..d.rows
            },
            ..d
        });
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
        x.draft = x.draft.map(|d| Draft {
            rows: Rows {
                stride: max,
                ..d.rows
            },
            ..d
        });
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
        x.draft = x.draft.map(|d| Draft {
            rows: Rows {
                stride: V - 1,
                ..d.rows
            },
            ..d
        });
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
        x.draft = x.draft.map(|d| Draft {
            rows: Rows {
                stride: 0,
                ..d.rows
            },
            ..d
        });
        x
    };
    assert_eq!(shape(&one_hot, B, 6), Ok(()));
    // Wider strides: the rows are padded.
    let wide_d = [0.25f32; B * KM * (V + 1)];
    let wide_t = [0.25f32; B * (KM + 1) * (V + 2)];
    let wide = {
        let mut x = b;
        x.draft = Some(Rows::f32(&wide_d, x.draft.map_or(x.vocab, |d| d.rows.stride)).into());
        x.draft = x.draft.map(|d| Draft {
            rows: Rows {
                stride: V + 1,
                ..d.rows
            },
            ..d
        });
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
                x.draft = Some(
                    Rows::f32(&d.draft[..15], x.draft.map_or(x.vocab, |d| d.rows.stride)).into(),
                );
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
                x.draft = x.draft.map(|d| Draft {
                    rows: Rows {
                        stride: usize::MAX,
                        ..d.rows
                    },
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
    let cases: [(VerifyError, &str); 11] = [
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
            VerifyError::BadParam {
                request: 1,
                param: Param::TopP,
            },
            "request 1: TopP is outside its range",
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

#[test]
fn empty_drafts_are_what_the_padded_support_lacks() {
    // V = 2, k_max = 1: request 0 drafts one token, request 1 none (k = 0).
    let target = [0.5f32, 0.5, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0];
    let batch = Batch::dense(
        Dims { vocab: 2, k_max: 1 },
        Drafts {
            k: &[1, 0],
            ids: &[1, 0],
        },
        &target,
        Streams {
            seed: &[1, 2],
            offset: &[0, 0],
        },
    );
    let (mut accepted, mut tokens) = ([0u32; 2], [0u32; 4]);
    let out = Outputs::new(
        specula_core::verify::AcceptedOut(&mut accepted),
        specula_core::verify::TokensOut(&mut tokens),
    );
    let check = |support| {
        specula_core::verify::validate_with::<4>(
            support,
            Method::Greedy,
            Check::STRICT,
            &batch,
            &out,
        )
    };
    use specula_core::verify::Support;
    assert_eq!(
        check(Support::PADDED),
        Err(VerifyError::DraftLength {
            request: 1,
            k: 0,
            k_max: 1
        })
    );
    assert_eq!(check(Support::EMPTY_DRAFTS), Ok(()));
    // Nothing else: the padded support's other refusals stay (here: a method per request).
    let methods = [Method::Greedy; 2];
    let per_request = batch.with_methods(&methods);
    assert!(matches!(
        specula_core::verify::validate_with::<4>(
            Support::EMPTY_DRAFTS,
            Method::Greedy,
            Check::STRICT,
            &per_request,
            &out
        ),
        Err(VerifyError::Unsupported { .. })
    ));
}
