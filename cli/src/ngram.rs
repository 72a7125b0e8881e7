//! Character n-gram language models: the demo's draft and target models.
//!
//! Small, trained in milliseconds, and honest: the draft (a bigram by default) and the target
//! (a trigram) disagree exactly as much as their contexts differ, so the acceptance rates the
//! demo reports are real ones. Smoothing is interpolated Witten–Bell over add-one unigrams, so
//! every character of the vocabulary has a positive probability in every context.

use std::collections::HashMap;

/// The corpus the demo's models train on by default (public-domain texts, see `corpus/README.md`).
pub const CORPUS: &str = include_str!("../corpus/public-domain.txt");

/// Why a model could not be trained.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NgramError {
    /// The corpus has fewer than `needed` characters.
    CorpusTooSmall {
        /// Characters found.
        chars: usize,
        /// Characters needed.
        needed: usize,
    },
    /// The order is outside `1..=MAX_ORDER`.
    BadOrder(usize),
    /// The corpus uses more distinct characters than [`MAX_VOCAB`].
    VocabTooLarge(usize),
}

impl std::fmt::Display for NgramError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::CorpusTooSmall { chars, needed } => write!(
                f,
                "corpus too small: {chars} characters, at least {needed} needed"
            ),
            Self::BadOrder(n) => write!(f, "n-gram order {n} is outside 1..={MAX_ORDER}"),
            Self::VocabTooLarge(n) => write!(
                f,
                "corpus uses {n} distinct characters, at most {MAX_VOCAB} supported"
            ),
        }
    }
}

impl std::error::Error for NgramError {}

/// Highest n-gram order supported (contexts of up to 4 ids pack into a 64-bit key).
pub const MAX_ORDER: usize = 5;
/// Most distinct characters supported (ids are packed 16 bits each into context keys).
pub const MAX_VOCAB: usize = 4096;
/// Fewest corpus characters accepted.
pub const MIN_CORPUS: usize = 64;

/// The characters of a corpus, as dense token ids.
#[derive(Clone, Debug)]
pub struct Vocab {
    chars: Vec<char>,
    ids: HashMap<char, u32>,
}

impl Vocab {
    /// The distinct characters of `text`, sorted (ids do not depend on first appearance).
    pub fn from_text(text: &str) -> Result<Self, NgramError> {
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        if chars.len() > MAX_VOCAB {
            return Err(NgramError::VocabTooLarge(chars.len()));
        }
        let ids = chars
            .iter()
            .enumerate()
            .map(|(i, &c)| (c, i as u32))
            .collect();
        Ok(Self { chars, ids })
    }

    /// Vocabulary size.
    pub fn len(&self) -> usize {
        self.chars.len()
    }

    /// The id of `c`.
    pub fn id(&self, c: char) -> Option<u32> {
        self.ids.get(&c).copied()
    }

    /// The ids of the characters of `text` that are in the vocabulary.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        text.chars().filter_map(|c| self.id(c)).collect()
    }

    /// The text of `ids` (ids outside the vocabulary become U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> String {
        ids.iter()
            .map(|&i| self.chars.get(i as usize).copied().unwrap_or('\u{FFFD}'))
            .collect()
    }
}

#[derive(Clone, Debug, Default)]
struct Followers {
    total: u32,
    next: Vec<(u32, u32)>,
}

/// An interpolated Witten–Bell character n-gram model.
#[derive(Clone, Debug)]
pub struct NgramModel {
    order: usize,
    vocab: usize,
    unigram: Vec<u32>,
    tokens: u64,
    /// `contexts[n-1]`: followers of each context of length `n`.
    contexts: Vec<HashMap<u64, Followers>>,
}

fn key(ctx: &[u32]) -> u64 {
    ctx.iter()
        .fold(0u64, |k, &t| (k << 16) | (u64::from(t) + 1))
}

impl NgramModel {
    /// Trains an order-`order` model (1 = unigram, 2 = bigram, …) on `ids` over a vocabulary of
    /// `vocab` ids.
    pub fn train(ids: &[u32], vocab: usize, order: usize) -> Result<Self, NgramError> {
        if !(1..=MAX_ORDER).contains(&order) {
            return Err(NgramError::BadOrder(order));
        }
        if ids.len() < MIN_CORPUS {
            return Err(NgramError::CorpusTooSmall {
                chars: ids.len(),
                needed: MIN_CORPUS,
            });
        }
        if vocab > MAX_VOCAB {
            return Err(NgramError::VocabTooLarge(vocab));
        }
        let mut unigram = vec![0u32; vocab];
        let mut contexts: Vec<HashMap<u64, HashMap<u32, u32>>> = vec![HashMap::new(); order - 1];
        for (i, &t) in ids.iter().enumerate() {
            if let Some(c) = unigram.get_mut(t as usize) {
                *c = c.saturating_add(1);
            }
            for n in 1..order {
                if i >= n {
                    let e = contexts[n - 1].entry(key(&ids[i - n..i])).or_default();
                    *e.entry(t).or_default() += 1;
                }
            }
        }
        let contexts = contexts
            .into_iter()
            .map(|m| {
                m.into_iter()
                    .map(|(k, f)| {
                        let mut next: Vec<(u32, u32)> = f.into_iter().collect();
                        next.sort_unstable();
                        let total = next.iter().map(|&(_, c)| c).sum();
                        (k, Followers { total, next })
                    })
                    .collect()
            })
            .collect();
        Ok(Self {
            order,
            vocab,
            unigram,
            tokens: ids.len() as u64,
            contexts,
        })
    }

    /// The vocabulary size.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Writes `P(next | history)` into `out[..vocab]` (uses the last `order − 1` ids of
    /// `history`); the values are positive and sum to 1 (within f32 rounding).
    pub fn probs(&self, history: &[u32], out: &mut [f32]) {
        let v = self.vocab;
        let out = &mut out[..v];
        let mut p: Vec<f64> = self
            .unigram
            .iter()
            .map(|&c| (f64::from(c) + 1.0) / (self.tokens as f64 + v as f64))
            .collect();
        for n in 1..self.order {
            if history.len() < n {
                break;
            }
            let Some(f) = self.contexts[n - 1].get(&key(&history[history.len() - n..])) else {
                break; // an unseen context has no longer seen extension either
            };
            let types = f.next.len() as f64;
            let denom = f64::from(f.total) + types;
            let back = types / denom;
            p.iter_mut().for_each(|x| *x *= back);
            for &(t, c) in &f.next {
                p[t as usize] += f64::from(c) / denom;
            }
        }
        for (o, x) in out.iter_mut().zip(&p) {
            *o = *x as f32;
        }
    }
}

/// SplitMix64: the demo's own small, seeded generator for sampling draft tokens and picking
/// prompts (the verifier draws its randomness from Philox, per the determinism rules).
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_f64() * n as f64) as usize % n.max(1)
    }
}

/// Samples an id from `probs` (inverse CDF); the last id with positive mass if rounding leaves
/// the draw past the end.
pub fn sample(probs: &[f32], rng: &mut SplitMix64) -> u32 {
    let total: f64 = probs.iter().map(|&p| f64::from(p.max(0.0))).sum();
    let mut u = rng.next_f64() * total;
    let mut last = 0;
    for (i, &p) in probs.iter().enumerate() {
        if p > 0.0 {
            last = i;
            u -= f64::from(p);
            if u < 0.0 {
                return i as u32;
            }
        }
    }
    last as u32
}

/// The id with the largest probability (lowest id on ties).
pub fn argmax(probs: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &p) in probs.iter().enumerate() {
        if p > probs[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "the cat sat on the mat. the dog sat on the log. the cat and the dog.";

    #[test]
    fn distributions_are_normalised_and_positive() {
        let vocab = Vocab::from_text(TEXT).unwrap();
        let ids = vocab.encode(TEXT);
        for order in 1..=4 {
            let m = NgramModel::train(&ids, vocab.len(), order).unwrap();
            let mut p = vec![0f32; vocab.len()];
            for ctx in [
                &ids[..0],
                &ids[..1],
                &ids[..5],
                &[vocab.len() as u32 - 1; 3][..],
            ] {
                m.probs(ctx, &mut p);
                let s: f32 = p.iter().sum();
                assert!((s - 1.0).abs() < 1e-4, "order {order}: sum {s}");
                assert!(p.iter().all(|&x| x > 0.0));
            }
        }
    }

    #[test]
    fn higher_order_is_sharper_in_a_seen_context() {
        let vocab = Vocab::from_text(TEXT).unwrap();
        let ids = vocab.encode(TEXT);
        let (bi, tri) = (
            NgramModel::train(&ids, vocab.len(), 2).unwrap(),
            NgramModel::train(&ids, vocab.len(), 3).unwrap(),
        );
        let ctx = vocab.encode("th");
        let (mut a, mut b) = (vec![0f32; vocab.len()], vec![0f32; vocab.len()]);
        bi.probs(&ctx, &mut a);
        tri.probs(&ctx, &mut b);
        let e = vocab.id('e').unwrap() as usize;
        assert!(b[e] > a[e] && b[e] > 0.5);
        assert_eq!(vocab.decode(&ctx), "th");
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert_eq!(
            NgramModel::train(&[0; 10], 1, 2).unwrap_err(),
            NgramError::CorpusTooSmall {
                chars: 10,
                needed: MIN_CORPUS
            }
        );
        assert_eq!(
            NgramModel::train(&[0; 100], 1, 0).unwrap_err(),
            NgramError::BadOrder(0)
        );
    }
}
