//! [`OutputBuffers`]: the output buffers of a verification step, owned and sized from the batch.
//!
//! The core's [`Outputs`] borrows the caller's slices, whose lengths the caller computes from the
//! layout (`B`, `B × (k_max + 1)`, one per draft slot). A runtime with an allocator keeps one of
//! these instead, fits it to each step's batch (it only grows, so a steady state allocates
//! nothing) and lends it to the verify call.

use specula_core::verify::{AcceptedOut, Batch, Outputs, SENTINEL, TokensOut, draft_slots};

/// Output buffers sized from a [`Batch`]: `accepted` (one per request), `tokens` (`k_max + 1`
/// per request, [`SENTINEL`] after the last emitted one) and, once asked for with
/// [`with_recovered`](Self::with_recovered), vLLM's recovered tokens (one per draft slot).
///
/// ```
/// use specula::OutputBuffers;
/// use specula::specula_core::verify::{
///     verify_batch, Batch, Check, Dims, Drafts, Method, Streams,
/// };
/// use specula::specula_core::Counters;
///
/// let target = [0.1, 0.2, 0.6, 0.1, /* bonus row */ 0.0, 0.0, 0.0, 1.0];
/// let batch = Batch::dense(
///     Dims { vocab: 4, k_max: 1 },
///     Drafts { k: &[1], ids: &[2] },
///     &target,
///     Streams { seed: &[42], offset: &[0] },
/// );
/// let mut out = OutputBuffers::new();
/// let mut counters = Counters::<4>::ZERO;
/// verify_batch(Method::Greedy, Check::Cheap, &batch, &mut out.fit(&batch), &mut counters)?;
/// assert_eq!((out.accepted(), out.tokens()), (&[1][..], &[2, 3][..]));
/// # Ok::<(), specula::specula_core::verify::VerifyError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutputBuffers {
    accepted: Vec<u32>,
    tokens: Vec<u32>,
    recovered: Option<Vec<u32>>,
}

impl OutputBuffers {
    /// Empty buffers, without the recovered output.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The same buffers with the recovered-token output too (vLLM's `recovered_token_ids`,
    /// [`Outputs::with_recovered`]).
    #[must_use]
    pub fn with_recovered(mut self) -> Self {
        self.recovered.get_or_insert_with(Vec::new);
        self
    }

    /// Sizes the buffers for `batch` (growing their capacity only when a batch needs more than
    /// any before it) and lends them as the verify call's [`Outputs`]. Nothing is written on
    /// the way: a verification writes every slot it is lent (tokens after the last emitted one
    /// as [`SENTINEL`]), so a steady state of equal batches costs three length checks per
    /// step. Slots new to this size start as [`SENTINEL`]; after a refused batch (nothing
    /// written) the buffers hold what they held before.
    ///
    /// The sizes follow the batch's layout: `B` accepted counts, `B × (k_max + 1)` tokens and,
    /// with [`with_recovered`](Self::with_recovered), one recovered token per draft slot
    /// (`B × k_max` padded, `num_tokens` ragged), so a malformed batch is still refused by
    /// validation, not by these lengths.
    pub fn fit(&mut self, batch: &Batch<'_>) -> Outputs<'_> {
        let b = batch.requests();
        let width = batch.k_max.saturating_add(1);
        self.accepted.resize(b, SENTINEL);
        self.tokens.resize(b.saturating_mul(width), SENTINEL);
        if let Some(r) = self.recovered.as_mut() {
            r.resize(draft_slots(batch), SENTINEL);
        }
        let out = Outputs::new(AcceptedOut(&mut self.accepted), TokensOut(&mut self.tokens));
        match self.recovered.as_mut() {
            Some(r) => out.with_recovered(r),
            None => out,
        }
    }

    /// Accepted draft tokens per request, as the last verification wrote them.
    #[must_use]
    pub fn accepted(&self) -> &[u32] {
        &self.accepted
    }

    /// Emitted tokens, `k_max + 1` per request.
    #[must_use]
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Recovered tokens, one per draft slot; `None` without [`with_recovered`](Self::with_recovered).
    #[must_use]
    pub fn recovered(&self) -> Option<&[u32]> {
        self.recovered.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specula_core::Counters;
    use specula_core::verify::{
        Check, Dims, Drafts, Method, RaggedDrafts, Streams, Verifier, verify_batch,
    };

    #[test]
    fn buffers_follow_the_batch_and_reuse_their_capacity() {
        let target = [0.5f32; 2 * 3 * 2];
        let padded = Batch::dense(
            Dims { vocab: 2, k_max: 2 },
            Drafts {
                k: &[2, 1],
                ids: &[0, 1, 1, 0],
            },
            &target,
            Streams {
                seed: &[1, 2],
                offset: &[0, 0],
            },
        );
        let mut out = OutputBuffers::new().with_recovered();
        {
            let Outputs::Host {
                accepted,
                tokens,
                recovered,
                ..
            } = out.fit(&padded)
            else {
                panic!("host outputs")
            };
            assert_eq!((accepted.len(), tokens.len()), (2, 6));
            assert_eq!(recovered.as_deref().map(<[u32]>::len), Some(4));
        }
        let grown = out.tokens.capacity();
        // A ragged batch: one request with 1 draft, one with none: 1 draft slot.
        let ragged_target = [0.5f32; (1 + 2) * 2];
        let ragged = Batch::ragged(
            2,
            RaggedDrafts {
                cu_num_draft_tokens: &[1, 1],
                ids: &[1],
            },
            &ragged_target,
            Streams {
                seed: &[1, 2],
                offset: &[0, 0],
            },
        );
        let mut counters = Counters::<4>::ZERO;
        verify_batch(
            Method::Greedy,
            Check::Cheap,
            &ragged,
            &mut out.fit(&ragged),
            &mut counters,
        )
        .unwrap();
        assert_eq!(out.accepted().len(), 2);
        assert_eq!(out.tokens().len(), 4, "k_max 1: two tokens per request");
        assert_eq!(out.recovered().map(<[u32]>::len), Some(1), "one draft slot");
        assert_eq!(
            out.tokens.capacity(),
            grown,
            "a smaller batch reuses the buffers"
        );
        assert_eq!(
            counters.drafts, 1,
            "the request without drafts is not a draft"
        );
        // Without the recovered output the verifier is not asked for it.
        let mut plain = OutputBuffers::new();
        assert!(!plain.fit(&padded).produce().recovered);
        assert_eq!(plain.recovered(), None);
        let mut r = specula_core::verify::Reference::<4>::new();
        r.verify(
            Method::Greedy,
            Check::Cheap,
            &padded,
            &mut plain.fit(&padded),
        )
        .unwrap();
        // Flat rows: the argmax is token 0 (ties to the lowest id).
        assert_eq!(plain.accepted(), [1, 0]);
        assert_eq!(plain.tokens(), [0, 0, SENTINEL, 0, SENTINEL, SENTINEL]);
        // fit writes nothing: stale values in the lent slots are the verifier's to overwrite,
        // and it overwrites every one.
        plain.tokens.fill(77);
        plain.accepted.fill(77);
        r.verify(
            Method::Greedy,
            Check::Cheap,
            &padded,
            &mut plain.fit(&padded),
        )
        .unwrap();
        assert_eq!(plain.accepted(), [1, 0]);
        assert_eq!(plain.tokens(), [0, 0, SENTINEL, 0, SENTINEL, SENTINEL]);
        // The recovered output too: every draft slot is written.
        let mut rec = OutputBuffers::new().with_recovered();
        let _ = rec.fit(&padded);
        rec.recovered.as_mut().unwrap().fill(77);
        r.verify(Method::Greedy, Check::Cheap, &padded, &mut rec.fit(&padded))
            .unwrap();
        let written = rec.recovered().unwrap();
        assert_eq!(written.len(), 4);
        assert!(!written.contains(&77), "{written:?}");
    }
}
