//! The recovered-token output of the verification call (`Outputs::with_recovered`) in the core
//! reference, and its vLLM adapter (`to_vllm_recovered`). Small vocabularies, so Miri runs it:
//! `cargo +nightly miri test -p specula-core --test it recovered::`.
//!
//! * `verify_batch` with the output gives the accepted counts, tokens and counts it gives
//!   without it, and the tokens of the separate `recovered_tokens` call: every method, a method
//!   per request, logits (temperature 0 included) with filters, padded and ragged, `k = 0`;
//! * its length is checked (`Length { Recovered }`, after the other outputs), a backend
//!   without `Support::recovered` refuses it, and nothing is written or counted on error;
//! * `to_vllm_recovered` packs the padded layout and converts the ragged one to the same flat
//!   `i32` values, with typed errors and nothing written on them.

use specula_core::Counters;
use specula_core::verify::{
    AcceptedOut, Batch, Check, Dims, Drafts, Feature, Filter, Layout, Logits, Method, Outputs,
    Param, RaggedDrafts, SENTINEL, Streams, Support, TokensOut, VerifyError, draft_slots,
    recovered_tokens, to_vllm_recovered, validate_with, verify_batch,
};

const K: usize = 4;
const V: usize = 5;
const METHODS: [Method; 3] = [Method::Rejection, Method::Greedy, Method::Typical];

/// A SplitMix64 stream: the inputs depend only on the seed.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// A normalised probability row of `V` values (some zeros).
    fn row(&mut self) -> [f32; V] {
        let mut r = [0f32; V];
        for x in &mut r {
            *x = if self.below(4) == 0 {
                0.0
            } else {
                self.below(100) as f32
            };
        }
        let s: f32 = r.iter().sum();
        if s == 0.0 {
            r[self.below(V)] = 1.0;
            return r;
        }
        r.map(|x| x / s)
    }
}

/// Three requests, `k_max = 3`, one with `k = 0`, probabilities for draft and target.
struct Case {
    k: [u32; 3],
    ids: Vec<u32>,
    draft: Vec<f32>,
    target: Vec<f32>,
    logits: Vec<f32>,
    temps: [f32; 3],
    methods: [Method; 3],
    /// Top-k 0, 2 and 3.
    top_k: [Filter; 3],
}

const KM: usize = 3;

impl Case {
    fn new(g: &mut Gen) -> Self {
        let k = [g.below(KM + 1) as u32, 0, 1 + g.below(KM) as u32];
        let mut ids = vec![0u32; 3 * KM];
        let mut draft = Vec::new();
        let mut target = Vec::new();
        for b in 0..3 {
            for j in 0..KM {
                let d = g.row();
                ids[b * KM + j] = if g.below(2) == 0 {
                    // Often the draft's own argmax-ish pick, so some are accepted.
                    d.iter()
                        .enumerate()
                        .fold(0, |best, (v, &x)| if x > d[best] { v } else { best })
                        as u32
                } else {
                    g.below(V) as u32
                };
                draft.extend(d);
            }
            for _ in 0..=KM {
                target.extend(g.row());
            }
        }
        let logits = target
            .iter()
            .map(|&p| if p == 0.0 { f32::NEG_INFINITY } else { p.ln() })
            .collect();
        Self {
            k,
            ids,
            draft,
            target,
            logits,
            temps: [0.7, 0.0, 1.3],
            methods: [
                METHODS[g.below(3)],
                METHODS[g.below(3)],
                METHODS[g.below(3)],
            ],
            top_k: [0, 2, 3].map(|k| Filter::NONE.with_top_k(k)),
        }
    }

    fn padded(&self) -> Batch<'_> {
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
                seed: &[3, 4, 5],
                offset: &[9, 0, 1],
            },
        )
        .with_draft_probs(&self.draft)
    }
}

/// The same requests in the ragged layout.
struct Ragged {
    cu: [u32; 3],
    ids: Vec<u32>,
    draft: Vec<f32>,
    target: Vec<f32>,
}

impl Ragged {
    fn of(c: &Case, target: &[f32]) -> Self {
        let mut r = Self {
            cu: [0; 3],
            ids: vec![],
            draft: vec![],
            target: vec![],
        };
        let mut cu = 0;
        for b in 0..3 {
            let k = c.k[b] as usize;
            cu += c.k[b];
            r.cu[b] = cu;
            r.ids.extend_from_slice(&c.ids[b * KM..b * KM + k]);
            r.draft
                .extend_from_slice(&c.draft[b * KM * V..(b * KM + k) * V]);
            let t0 = b * (KM + 1) * V;
            r.target.extend_from_slice(&target[t0..t0 + (k + 1) * V]);
        }
        r
    }

    fn view(&self) -> Batch<'_> {
        Batch::ragged(
            V,
            RaggedDrafts {
                cu_num_draft_tokens: &self.cu,
                ids: &self.ids,
            },
            &self.target,
            Streams {
                seed: &[3, 4, 5],
                offset: &[9, 0, 1],
            },
        )
        .with_draft_probs(&self.draft)
    }
}

/// `verify_batch` with the output against `verify_batch` without it plus `recovered_tokens`.
fn one_call_equals_two(m: Method, batch: &Batch<'_>, what: &str) -> Vec<u32> {
    let b = batch.requests();
    let w = batch.k_max + 1;
    let slots = draft_slots(batch);
    let mut want_rec = vec![0xAAAA_AAAA; slots];
    recovered_tokens::<K>(m, Check::STRICT, batch, &mut want_rec).unwrap();
    let (mut wa, mut wt, mut wc) = (vec![0; b], vec![0; b * w], Counters::<K>::ZERO);
    verify_batch(
        m,
        Check::STRICT,
        batch,
        &mut Outputs::new(AcceptedOut(&mut wa), TokensOut(&mut wt)),
        &mut wc,
    )
    .unwrap();
    let (mut ga, mut gt, mut gc) = (vec![0; b], vec![0; b * w], Counters::<K>::ZERO);
    let mut got_rec = vec![0xBBBB_BBBB; slots];
    verify_batch(
        m,
        Check::STRICT,
        batch,
        &mut Outputs::new(AcceptedOut(&mut ga), TokensOut(&mut gt)).with_recovered(&mut got_rec),
        &mut gc,
    )
    .unwrap();
    assert_eq!((ga, gt, gc), (wa, wt, wc), "{what} {m:?}: outputs");
    assert_eq!(got_rec, want_rec, "{what} {m:?}: recovered");
    got_rec
}

#[test]
fn one_call_gives_what_two_calls_give() {
    let mut g = Gen(0x2EC0);
    let rounds = if cfg!(miri) { 3 } else { 60 };
    for i in 0..rounds {
        let c = Case::new(&mut g);
        let r = Ragged::of(&c, &c.target);
        let rl = Ragged::of(&c, &c.logits);
        for m in METHODS {
            let padded = one_call_equals_two(m, &c.padded(), &format!("{i} padded"));
            for b in 0..3 {
                let k = c.k[b] as usize;
                assert!(
                    padded[b * KM + k..(b + 1) * KM]
                        .iter()
                        .all(|&t| t == SENTINEL)
                );
            }
            let ragged = one_call_equals_two(m, &r.view(), &format!("{i} ragged"));
            // The vLLM adapter packs the padded output into the ragged one.
            let mut from_padded = vec![0i32; ragged.len()];
            to_vllm_recovered(&c.padded(), &padded, &mut from_padded).unwrap();
            let mut from_ragged = vec![0i32; ragged.len()];
            to_vllm_recovered(&r.view(), &ragged, &mut from_ragged).unwrap();
            let want: Vec<i32> = ragged.iter().map(|&t| t as i32).collect();
            assert_eq!((&from_padded, &from_ragged), (&want, &want), "{i} {m:?}");
            // Logits, a temperature per request (0: greedy), top-k, a method per request.
            let lv = rl.view().with_target_logits(Logits {
                values: &rl.target,
                temperature: &c.temps,
            });
            one_call_equals_two(
                m,
                &lv.with_filters(&c.top_k).with_methods(&c.methods),
                &format!("{i} ragged logits"),
            );
        }
    }
}

#[test]
fn bad_recovered_outputs_are_typed_errors_with_nothing_written() {
    let mut g = Gen(7);
    let c = Case::new(&mut g);
    let batch = c.padded();
    let slots = draft_slots(&batch);
    assert_eq!(slots, 3 * KM);
    for len in [0, slots - 1, slots + 1] {
        let (mut a, mut t, mut rec) = ([5u32; 3], [5u32; 12], vec![5u32; len]);
        let mut counters = Counters::<K>::ZERO;
        let e = verify_batch(
            Method::Rejection,
            Check::STRICT,
            &batch,
            &mut Outputs::new(AcceptedOut(&mut a), TokensOut(&mut t)).with_recovered(&mut rec),
            &mut counters,
        );
        assert_eq!(
            e,
            Err(VerifyError::Length {
                param: Param::Recovered,
                len,
                expected: slots
            })
        );
        assert_eq!((a, t), ([5; 3], [5; 12]));
        assert!(rec.iter().all(|&x| x == 5));
        assert!(counters.is_zero());
    }
    // A backend that does not fill it refuses it, whatever its length.
    let (mut a, mut t, mut rec) = ([5u32; 3], [5u32; 12], [5u32; 9]);
    let out = Outputs::new(AcceptedOut(&mut a), TokensOut(&mut t)).with_recovered(&mut rec);
    assert_eq!(
        validate_with::<K>(
            Support::EMPTY_DRAFTS,
            Method::Greedy,
            Check::Cheap,
            &batch,
            &out
        ),
        Err(VerifyError::Unsupported {
            feature: Feature::Recovered
        })
    );
    let declared = [Support::PADDED, Support::EMPTY_DRAFTS, Support::ALL].map(|s| s.recovered);
    assert_eq!(declared, [false, false, true]);
}

#[test]
fn the_vllm_adapter_checks_its_inputs() {
    let target = [0f32; 2 * 3 * 4];
    let k = [2u32, 1];
    let batch = Batch::dense(
        Dims { vocab: 4, k_max: 2 },
        Drafts {
            k: &k,
            ids: &[1, 2, 3, 0],
        },
        &target,
        Streams {
            seed: &[1, 2],
            offset: &[0, 0],
        },
    );
    let mut out = [-7i32; 3];
    assert_eq!(
        to_vllm_recovered(&batch, &[1, 2, 3], &mut out),
        Err(VerifyError::Length {
            param: Param::Recovered,
            len: 3,
            expected: 4
        })
    );
    assert_eq!(
        to_vllm_recovered(&batch, &[1, 2, 3, SENTINEL], &mut out[..2]),
        Err(VerifyError::Length {
            param: Param::Recovered,
            len: 2,
            expected: 3
        })
    );
    assert_eq!(
        to_vllm_recovered(&batch, &[1, 1 << 31, 3, SENTINEL], &mut out),
        Err(VerifyError::VllmTokenRange {
            index: 1,
            token: 1 << 31
        })
    );
    assert_eq!(out, [-7; 3], "nothing written on error");
    // The padding is never read: a sentinel there is fine.
    to_vllm_recovered(&batch, &[1, 2, 3, SENTINEL], &mut out).unwrap();
    assert_eq!(out, [1, 2, 3]);
    let mut long = batch;
    let k3 = [3u32, 1];
    long.layout = Layout::Padded { k: &k3 };
    assert_eq!(
        to_vllm_recovered(&long, &[1, 2, 3, 0], &mut out),
        Err(VerifyError::DraftLength {
            request: 0,
            k: 3,
            k_max: 2
        })
    );
    // Ragged: the values as they are.
    let rt = [0f32; 5 * 4];
    let ragged = Batch::ragged(
        4,
        RaggedDrafts {
            cu_num_draft_tokens: &[2, 3],
            ids: &[1, 2, 3],
        },
        &rt,
        Streams {
            seed: &[1, 2],
            offset: &[0, 0],
        },
    );
    to_vllm_recovered(&ragged, &[3, 0, 2], &mut out).unwrap();
    assert_eq!(out, [3, 0, 2]);
}

/// `recovered_tokens` of logits (at `T > 0`, with and without a filter) are those of the same
/// rows processed into probabilities (`Processed`, the definition), for every method; greedy
/// slots are the processed rows' argmax. Independent of `verify_batch`, so a `recovered_at`
/// that read the stored logits as probabilities, or wrote a constant, fails.
#[test]
fn recovered_tokens_of_logits_are_those_of_their_processed_rows() {
    use specula_core::verify::{Processed, Values};
    for seed in 0..20 {
        let c = Case::new(&mut Gen(seed));
        // Every request drafts all KM positions, so every slot is written.
        let k = [KM as u32; 3];
        let temps = [0.7f32, 1.3, 0.9];
        for top_k in [None, Some(&c.top_k)] {
            let logits = Batch::dense(
                Dims {
                    vocab: V,
                    k_max: KM,
                },
                Drafts { k: &k, ids: &c.ids },
                &c.target,
                Streams {
                    seed: &[3, 4, 5],
                    offset: &[9, 0, 1],
                },
            )
            .with_draft_probs(&c.draft)
            .with_target_logits(Logits {
                values: &c.logits,
                temperature: &temps,
            });
            let logits = match top_k {
                Some(t) => logits.with_filters(t),
                None => logits,
            };
            let mut probs = vec![0f32; c.logits.len()];
            for (r, (row, out)) in c.logits.chunks(V).zip(probs.chunks_mut(V)).enumerate() {
                let b = r / (KM + 1);
                let filter = top_k.map_or(Filter::NONE, |t| t[b]);
                let pr = Processed::of(Values::F32(row), Some(temps[b]), filter);
                for (o, &l) in out.iter_mut().zip(row) {
                    *o = pr.p(l);
                }
            }
            let processed = Batch::dense(
                Dims {
                    vocab: V,
                    k_max: KM,
                },
                Drafts { k: &k, ids: &c.ids },
                &probs,
                Streams {
                    seed: &[3, 4, 5],
                    offset: &[9, 0, 1],
                },
            )
            .with_draft_probs(&c.draft);
            for m in METHODS {
                let (mut from_logits, mut from_probs) = ([0u32; 3 * KM], [0u32; 3 * KM]);
                recovered_tokens::<K>(m, Check::STRICT, &logits, &mut from_logits).unwrap();
                recovered_tokens::<K>(m, Check::STRICT, &processed, &mut from_probs).unwrap();
                let what = format!("seed {seed} {m:?} top-k {}", top_k.is_some());
                assert_eq!(from_logits, from_probs, "{what}");
                if m == Method::Greedy {
                    for (slot, &x) in from_logits.iter().enumerate() {
                        let (b, j) = (slot / KM, slot % KM);
                        let row = &probs[(b * (KM + 1) + j) * V..][..V];
                        let best =
                            (0..V).fold(0, |best, v| if row[v] > row[best] { v } else { best });
                        assert_eq!(x as usize, best, "{what}: slot {slot}");
                    }
                }
            }
        }
    }
}
