//! The engine inputs of issue 13 (`k = 0`, the ragged layout, caller-supplied bonus tokens,
//! f32 target logits with per-request temperature) through the shared GPU orchestration, over
//! any [`Driver`]: the host driver runs these in CI (`tests/tests/it/gpu_host_inputs.rs`), the
//! CUDA and ROCm device tests on a GPU.

use crate::conformance::{self as c, BatchData, Gen, K, OutData, RaggedData};
use specula_core::Counters;
use specula_core::gpu::{Driver, GpuError, GpuVerifier, Inputs, Staging};
use specula_core::verify::{AcceptedOut, Outputs, Produce, TokensOut};
use specula_core::verify::{
    Batch, Check, Half, HalfLogits, Logits, Method, RaggedDrafts, Streams, Strides, Verifier,
    verify_batch,
};

/// An owned step of one kind: padded or ragged, with or without bonus tokens, probabilities or
/// logits with a temperature per request (about a third of them 0: greedy).
#[derive(Clone, Debug)]
pub struct Step {
    /// The requests, padded.
    pub d: BatchData,
    /// The same requests in the ragged layout, when the kind is ragged.
    pub ragged: Option<RaggedData>,
    /// Bonus tokens, when the kind has them.
    pub bonus: Option<Vec<u32>>,
    /// Logits (in the target layout of the kind) and temperatures, when the kind has them.
    pub logits: Option<(Vec<f32>, Vec<f32>)>,
}

impl Step {
    /// `d`'s requests as a batch with `inputs` (its `draft_probs` is `d`'s own).
    pub fn new(g: &mut Gen, d: BatchData, inputs: Inputs) -> Self {
        let b = d.requests();
        let bonus: Option<Vec<u32>> = inputs
            .bonus
            .then(|| (0..b).map(|_| g.below(d.vocab) as u32).collect());
        let ragged = inputs
            .ragged
            .then(|| RaggedData::from_padded(&d, bonus.as_deref()));
        let rows = ragged
            .as_ref()
            .map_or(d.target_probs.len(), |r| r.target_probs.len());
        let logits = inputs.logits.then(|| {
            let values = (0..rows).map(|_| 8.0 * g.unit() - 4.0).collect();
            let temps = (0..b)
                .map(|_| if g.chance(1, 3) { 0.0 } else { 0.2 + g.unit() })
                .collect();
            (values, temps)
        });
        Self {
            d,
            ragged,
            bonus,
            logits,
        }
    }

    /// The borrowed batch.
    pub fn view(&self) -> Batch<'_> {
        let mut batch = match &self.ragged {
            Some(r) => r.view(), // bonus tokens included
            None => match &self.bonus {
                Some(x) => self.d.view().with_bonus(x),
                None => self.d.view(),
            },
        };
        if let Some((values, temperature)) = &self.logits {
            batch = batch.with_target_logits(Logits {
                values,
                temperature,
            });
        }
        batch
    }
}

/// The reference's outputs and counts of `batch` (which must be valid).
pub fn reference(method: Method, batch: &Batch<'_>) -> (OutData, Counters<K>) {
    let mut out = OutData::new(batch.requests(), batch.k_max);
    let mut counted = Counters::ZERO;
    verify_batch(method, Check::Cheap, batch, &mut out.view(), &mut counted)
        .expect("a valid batch");
    (out, counted)
}

/// The kinds of batch a graph is captured for, all with draft probabilities: ragged, bonus
/// tokens (padded), logits with mixed temperatures (padded), and all three at once.
#[must_use]
pub fn kinds() -> [Inputs; 4] {
    let base = Inputs {
        draft_probs: true,
        ..Inputs::default()
    };
    [
        Inputs {
            ragged: true,
            ..base
        },
        Inputs {
            bonus: true,
            ..base
        },
        Inputs {
            logits: true,
            ..base
        },
        Inputs {
            ragged: true,
            bonus: true,
            logits: true,
            ..base
        },
    ]
}

/// For each of [`kinds`]: a graph captured once on `v` replays `steps` batches of that kind
/// with changing size, `k` (`k = 0` included), seeds, offsets, method, bonus tokens and
/// temperatures written into the same staging buffers; outputs and counts equal the
/// reference's, no replay makes a synchronising call (the verifier's count, and `syncs()`, the
/// driver's own), and a batch of another kind is refused (`GraphMismatch`) before anything runs.
pub fn graph_replays<D: Driver>(
    v: &mut GpuVerifier<D, K>,
    seed: u64,
    steps: usize,
    syncs: impl Fn() -> u64,
) {
    let drv = v.driver().clone();
    let mut g = Gen(seed);
    let pool = c::full_layout_batch(&mut g, 6);
    let cap = pool.requests();
    // The most any step drawn from the pool needs: every request with k_max drafts.
    let mut most = pool.clone();
    most.k.fill(pool.k_max as u32);
    for kind in kinds() {
        let mut staging = Staging::new();
        for inputs in kinds() {
            let s = Step::new(&mut g, most.clone(), inputs);
            staging.reserve(&drv, &s.view(), Produce::TOKENS).unwrap();
        }
        let first = Step::new(&mut g, pool.clone(), kind);
        let mut out = OutData::new(cap, pool.k_max);
        v.stage(
            &mut staging,
            Method::Rejection,
            Check::Cheap,
            &first.view(),
            &out.view(),
        )
        .unwrap();
        let args = staging
            .write::<K>(
                &drv,
                v.stream(),
                Method::Rejection,
                &first.view(),
                Produce::TOKENS,
            )
            .unwrap();
        assert_eq!(args.inputs(), kind);
        // SAFETY: staged views; every replay follows a write of a batch of this kind
        // (`replay_staged` checks).
        let graph = unsafe { v.capture_staged(&args) }.unwrap();
        let before = v.totals().unwrap();
        let mut expected = Counters::<K>::ZERO;
        for step in 0..steps {
            let method = c::METHODS[step % 3];
            let mut d = c::vary(&mut g, &pool);
            for k in &mut d.k {
                if g.chance(1, 3) {
                    *k = 0;
                }
            }
            let s = Step::new(&mut g, d, kind);
            let batch = s.view();
            let (want, counted) = reference(method, &batch);
            expected.add(&counted);
            let staged = staging
                .write::<K>(&drv, v.stream(), method, &batch, Produce::TOKENS)
                .unwrap();
            let at = (v.sync_calls(), syncs());
            v.replay_staged(&graph, &staged).unwrap();
            assert_eq!((v.sync_calls(), syncs()), at, "a replay never synchronises");
            let mut got = OutData::new(batch.requests(), batch.k_max);
            let flags = v
                .download_outputs(
                    &staged,
                    &mut Outputs::new(AcceptedOut(&mut got.accepted), TokensOut(&mut got.tokens)),
                )
                .unwrap();
            assert_eq!(flags, 0, "{kind:?} step {step}: kernel error flags");
            assert_eq!(got, want, "{kind:?} step {step} {method:?}");
        }
        // Another kind through this graph: refused, nothing runs.
        let other = kinds()
            .into_iter()
            .find(|k| *k != kind)
            .expect("four kinds");
        let d = c::vary(&mut g, &pool);
        let s = Step::new(&mut g, d, other);
        let staged = staging
            .write::<K>(&drv, v.stream(), Method::Greedy, &s.view(), Produce::TOKENS)
            .unwrap();
        assert_eq!(
            v.replay_staged(&graph, &staged),
            Err(GpuError::GraphMismatch)
        );
        drop(graph);
        assert_eq!(
            v.totals().unwrap().delta_since(&before),
            expected,
            "{kind:?}: counted exactly the replayed requests"
        );
        let _ = out.view();
    }
}

/// Logits at V = 151 936 in the ragged layout (`k` = 2, 0, 1, a misaligned stride),
/// temperatures 0.7, 0 (greedy) and 1.3, every method, through `v`'s host-slice path; bit for
/// bit against the reference, counts included.
pub fn ragged_logits_at_151936<V: Verifier<K>>(v: &mut V)
where
    V::Error: core::fmt::Debug,
{
    let vocab = 151_936;
    let tstride = vocab + 3;
    let mut g = Gen(0x13_7D01);
    let cu = [2u32, 2, 3];
    let (b, tokens) = (cu.len(), cu[2] as usize);
    let logits: Vec<f32> = (0..(tokens + b) * tstride)
        .map(|_| 14.0 * g.unit() - 10.0)
        .collect();
    let ids: Vec<u32> = (0..tokens).map(|_| g.below(vocab) as u32).collect();
    let temps = [0.7f32, 0.0, 1.3];
    let (seed, offset) = ([21u64, 22, 23], [0u64, 9, u64::MAX - 1]);
    let batch = Batch::ragged(
        vocab,
        RaggedDrafts {
            cu_num_draft_tokens: &cu,
            ids: &ids,
        },
        &[],
        Streams {
            seed: &seed,
            offset: &offset,
        },
    )
    .with_strides(Strides {
        draft: vocab,
        target: tstride,
    })
    .with_target_logits(Logits {
        values: &logits,
        temperature: &temps,
    });
    for method in c::METHODS {
        let (want, counted) = reference(method, &batch);
        let before = v.totals().unwrap();
        let mut got = OutData::new(b, batch.k_max);
        v.verify(method, Check::Cheap, &batch, &mut got.view())
            .unwrap();
        assert_eq!(got, want, "V = {vocab} {method:?}");
        assert_eq!(v.totals().unwrap().delta_since(&before), counted);
    }
}

/// A method per request and each sampling filter (top-k, top-p, min-p, alone and together),
/// on the probability and the logits paths (temperatures 0, 0.7 and 1.3), then bf16 logits
/// with f16 draft probabilities and bf16 draft probabilities with f32 targets, at vocabulary
/// `vocab`, through `v`'s host-slice path; bit for bit against the reference, counts included.
/// Every request runs another method than the call's (`with_methods` overrides it).
pub fn methods_and_filters_at<V: Verifier<K>>(v: &mut V, seed: u64, vocab: usize)
where
    V::Error: core::fmt::Debug,
{
    let mut g = Gen(seed);
    let d = c::sized_batch(&mut g, 3, vocab, 2, true);
    let b = d.requests();
    let methods = [Method::Greedy, Method::Typical, Method::Rejection];
    let top_k = [1u32, 40, vocab as u32 + 1];
    let top_p = [0.9f32, 0.05, 1.0];
    let min_p = [0.05f32, 0.0, 0.3];
    let logits: Vec<f32> = d
        .target_probs
        .iter()
        .map(|_| (16.0 * g.unit()).round() * 0.5 - 4.0) // coarse: ties
        .collect();
    let temps = [0.7f32, 0.0, 1.3];
    for with_logits in [false, true] {
        for bits in [0b0001u8, 0b0010, 0b0100, 0b1000, 0b1111] {
            let mut batch = d.view();
            if with_logits {
                batch = batch.with_target_logits(Logits {
                    values: &logits,
                    temperature: &temps,
                });
            }
            if bits & 1 != 0 {
                batch = batch.with_methods(&methods);
            }
            let filters = c::filters_of(
                b,
                (bits & 2 != 0).then_some(&top_k[..]),
                (bits & 4 != 0).then_some(&top_p[..]),
                (bits & 8 != 0).then_some(&min_p[..]),
            );
            if let Some(f) = &filters {
                batch = batch.with_filters(f);
            }
            let method = c::METHODS[usize::from(bits) % 3];
            let (want, counted) = reference(method, &batch);
            let before = v.totals().unwrap();
            let mut got = OutData::new(b, batch.k_max);
            v.verify(method, Check::Cheap, &batch, &mut got.view())
                .unwrap();
            let what = format!("V = {vocab} logits {with_logits} {bits:04b} {method:?}");
            assert_eq!(got, want, "{what}");
            assert_eq!(v.totals().unwrap().delta_since(&before), counted, "{what}");
        }
    }
    // bf16 logits with f16 draft probabilities, then f32 probabilities with bf16 drafts, with
    // every filter and a method per request.
    let (lb, dh) = (c::to_bf16(&logits), d.draft_probs.as_deref().map(c::to_f16));
    let db = d.draft_probs.as_deref().map(c::to_bf16);
    let all = c::filters_of(b, Some(&top_k), Some(&top_p), Some(&min_p)).unwrap_or_default();
    for half_logits in [true, false] {
        let mut batch = d.view().with_methods(&methods).with_filters(&all);
        if half_logits {
            batch = batch
                .with_target_logits_half(HalfLogits {
                    values: Half::Bf16(&lb),
                    temperature: &temps,
                })
                .with_draft_probs_half(Half::F16(dh.as_deref().expect("drafts")));
        } else {
            batch = batch.with_draft_probs_half(Half::Bf16(db.as_deref().expect("drafts")));
        }
        let (want, counted) = reference(Method::Rejection, &batch);
        let before = v.totals().unwrap();
        let mut got = OutData::new(b, batch.k_max);
        v.verify(Method::Rejection, Check::Cheap, &batch, &mut got.view())
            .unwrap();
        let what = format!("V = {vocab} half logits {half_logits}");
        assert_eq!(got, want, "{what}");
        assert_eq!(v.totals().unwrap().delta_since(&before), counted, "{what}");
    }
}
