//! What the CPU benchmarks of the engine inputs share (`benches/verify_inputs.rs`,
//! `benches/recovered.rs`): one decode step's tensors, and per-call timing in this thread's CPU
//! time.

use crate::conformance::{Gen, sample};
use half::{bf16, f16};
use specula_core::verify::{Batch, Dims, Drafts, Streams};
use std::time::Instant;

/// One decode step of `b` requests with `k` drafts each over a vocabulary of `vocab` ids:
/// logits `3·ln u` (a long tail), the target probabilities their softmax at `t` (computed in
/// f64), draft rows near the target (each id's probability times a factor in 0.7..1.3,
/// renormalised, so most positions are accepted), draft ids sampled from them.
#[derive(Debug)]
pub struct Step {
    /// Ids per row.
    pub vocab: usize,
    /// Drafts per request.
    pub k: usize,
    /// Target logits, `b·(k+1)` rows.
    pub logits: Vec<f32>,
    /// The same logits as bf16 patterns.
    pub logits_bf16: Vec<u16>,
    /// The same logits as f16 (binary16) patterns.
    pub logits_f16: Vec<u16>,
    /// Target probabilities (softmax of the logits at `t`).
    pub probs: Vec<f32>,
    /// Draft probabilities, `b·k` rows.
    pub draft: Vec<f32>,
    /// Draft ids.
    pub ids: Vec<u32>,
    /// `k` per request.
    pub ks: Vec<u32>,
    /// Seeds.
    pub seed: Vec<u64>,
    /// Offsets.
    pub offset: Vec<u64>,
    /// `t` per request.
    pub temps: Vec<f32>,
}

impl Step {
    /// A step drawn from `g`.
    pub fn new(g: &mut Gen, b: usize, vocab: usize, k: usize, t: f32) -> Self {
        let logits: Vec<f32> = (0..b * (k + 1) * vocab)
            .map(|_| 3.0 * (g.unit() + 1e-6).ln())
            .collect();
        Self::from_logits(g, b, vocab, k, t, logits)
    }

    /// A step whose target rows are shaped like a language model's output: one id (drawn per
    /// row) holding about 0.7 of the probability at `t`, over a `2·N(0, 1)` background, so
    /// top-p 0.9 keeps about 2 % of the ids. The flat rows of [`Step::new`] let the sample
    /// of a filter see the whole mass; these hide most of it in one id.
    pub fn peaked(g: &mut Gen, b: usize, vocab: usize, k: usize, t: f32) -> Self {
        let mut logits = vec![0f32; b * (k + 1) * vocab];
        for row in logits.chunks_exact_mut(vocab) {
            for l in row.iter_mut() {
                *l = 2.0 * normal(g);
            }
            let top = g.below(vocab);
            row[top] = f32::NEG_INFINITY;
            // exp(L/t) = 0.7/0.3 · Σ_{v≠top} exp(l_v/t): the top id then holds 0.7.
            let rest: f64 = row
                .iter()
                .map(|&l| (f64::from(l) / f64::from(t)).exp())
                .sum();
            row[top] = (f64::from(t) * (rest * 0.7 / 0.3).ln()) as f32;
        }
        Self::from_logits(g, b, vocab, k, t, logits)
    }

    /// The step over the target `logits` (`b·(k+1)` rows of `vocab`).
    fn from_logits(
        g: &mut Gen,
        b: usize,
        vocab: usize,
        k: usize,
        t: f32,
        logits: Vec<f32>,
    ) -> Self {
        let rows = b * (k + 1);
        assert_eq!(logits.len(), rows * vocab);
        let logits_bf16 = logits
            .iter()
            .map(|&x| bf16::from_f32(x).to_bits())
            .collect();
        let logits_f16 = logits.iter().map(|&x| f16::from_f32(x).to_bits()).collect();
        let mut probs = vec![0f32; rows * vocab];
        for (p, l) in probs
            .chunks_exact_mut(vocab)
            .zip(logits.chunks_exact(vocab))
        {
            let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f64> = l
                .iter()
                .map(|&x| (f64::from(x - m) / f64::from(t)).exp())
                .collect();
            let s: f64 = e.iter().sum();
            for (o, x) in p.iter_mut().zip(&e) {
                *o = (x / s) as f32;
            }
        }
        let mut draft = vec![0f32; b * k * vocab];
        for r in 0..b {
            for j in 0..k {
                let tr = &probs[(r * (k + 1) + j) * vocab..][..vocab];
                let d = &mut draft[(r * k + j) * vocab..][..vocab];
                for (o, &x) in d.iter_mut().zip(tr) {
                    *o = x * (0.7 + 0.6 * g.unit());
                }
                let s: f32 = d.iter().sum();
                d.iter_mut().for_each(|x| *x /= s);
            }
        }
        let ids = (0..b * k)
            .map(|i| sample(g, &draft[i * vocab..(i + 1) * vocab]))
            .collect();
        Self {
            vocab,
            k,
            logits,
            logits_bf16,
            logits_f16,
            probs,
            draft,
            ids,
            ks: vec![k as u32; b],
            seed: (0..b as u64).collect(),
            offset: vec![3; b],
            temps: vec![t; b],
        }
    }

    /// The padded batch over the target probabilities, with the draft probabilities.
    pub fn batch(&self) -> Batch<'_> {
        Batch::dense(
            Dims {
                vocab: self.vocab,
                k_max: self.k,
            },
            Drafts {
                k: &self.ks,
                ids: &self.ids,
            },
            &self.probs,
            Streams {
                seed: &self.seed,
                offset: &self.offset,
            },
        )
        .with_draft_probs(&self.draft)
    }
}

/// A standard normal draw (Box–Muller, one of the pair).
fn normal(g: &mut Gen) -> f32 {
    let u = f64::from(g.unit()) + 1e-9;
    let v = f64::from(g.unit());
    ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
}

/// This thread's CPU time in seconds (user + system, clock ticks of 10 ms), if readable
/// (Linux `/proc/thread-self/stat`).
pub fn thread_cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// Seconds per call of `f` (after one warm-up call): this thread's CPU time over at least
/// 0.5 s of it, or wall time where CPU time cannot be read.
pub fn per_call_s(mut f: impl FnMut()) -> f64 {
    f();
    let (cpu0, wall0) = (thread_cpu_s(), Instant::now());
    let mut n = 0u64;
    loop {
        f();
        n += 1;
        let spent = match (cpu0, thread_cpu_s()) {
            (Some(a), Some(b)) => b - a,
            _ => wall0.elapsed().as_secs_f64(),
        };
        if spent >= 0.5 && n >= 3 {
            return spent / n as f64;
        }
    }
}
