//! [`Outputs`]: the caller's output buffers of one verification step, and their adapters to
//! vLLM's layout.

use super::{Batch, DeviceOutputs, Param, SENTINEL, VerifyError, draft_slots};

/// The caller's output buffers for a [`Batch`] of `B` requests: host slices
/// ([`Outputs::new`], with [`with_recovered`](Outputs::with_recovered)) or device memory
/// ([`Outputs::on_device`]), never both. Its variants are built by those constructors only
/// (`#[non_exhaustive]`: outputs can be added without breaking callers); a verifier matches
/// them.
#[derive(Debug)]
pub enum Outputs<'a> {
    /// Host slices ([`Outputs::new`]): the verifier writes them before it returns.
    #[non_exhaustive]
    Host {
        /// `accepted[b]`: how many draft tokens request `b` accepted (`B` values).
        accepted: &'a mut [u32],
        /// `tokens[b·(k_max+1) + j]`: the accepted draft tokens, then the one recovered or
        /// bonus token, then [`SENTINEL`] up to `k_max + 1` slots (`B · (k_max+1)` values).
        tokens: &'a mut [u32],
        /// vLLM's `recovered_token_ids`, filled by the same call when set
        /// ([`with_recovered`](Outputs::with_recovered)): one value per draft slot
        /// ([`draft_slots`]), laid out and computed exactly as
        /// [`recovered_tokens`](super::recovered_tokens) writes them. `None`: not wanted.
        recovered: Option<&'a mut [u32]>,
    },
    /// Device memory ([`Outputs::on_device`]), written in place by the launch (no copy down,
    /// no wait). Only the GPU verifiers take them ([`Support::device`](super::Support::device)).
    #[non_exhaustive]
    Device {
        /// The views the launch writes, in the host outputs' layout.
        outputs: DeviceOutputs<'a>,
    },
}

/// The `accepted` slice of [`Outputs::new`], named so it cannot be passed as the tokens.
#[derive(Debug)]
pub struct AcceptedOut<'a>(pub &'a mut [u32]);

/// The `tokens` slice of [`Outputs::new`], named so it cannot be passed as the accepted counts.
#[derive(Debug)]
pub struct TokensOut<'a>(pub &'a mut [u32]);

impl<'a> Outputs<'a> {
    /// Outputs from two named slices: the struct literal takes two `&mut [u32]` that a caller
    /// can swap without a compile error (both fields have the same type); this cannot be.
    ///
    /// ```
    /// use specula_core::verify::{AcceptedOut, Outputs, TokensOut};
    /// let (mut accepted, mut tokens) = ([0u32; 2], [0u32; 6]);
    /// let out = Outputs::new(AcceptedOut(&mut accepted), TokensOut(&mut tokens));
    /// let Outputs::Host { accepted, tokens, .. } = out else { unreachable!() };
    /// assert_eq!((accepted.len(), tokens.len()), (2, 6));
    /// ```
    #[must_use]
    pub fn new(accepted: AcceptedOut<'a>, tokens: TokensOut<'a>) -> Self {
        Self::Host {
            accepted: accepted.0,
            tokens: tokens.0,
            recovered: None,
        }
    }

    /// Outputs in device memory, in the host outputs' layout (`accepted`, `tokens`, and vLLM's
    /// recovered tokens when [`DeviceOutputs::recovered`] is set): a GPU verifier's launch
    /// writes them in place, so the step makes no copy down and no synchronising call
    /// (the kernel's error flags are then not read back: a batch that passed validation raises
    /// none). Validation checks their lengths as the host ones'; host verifiers refuse them
    /// ([`VerifyError::Unsupported`] with [`Feature::Device`](super::Feature::Device)).
    #[must_use]
    pub fn on_device(device: DeviceOutputs<'a>) -> Self {
        Self::Device { outputs: device }
    }

    /// Also writes vLLM's `recovered_token_ids` into `recovered`, in the same verification
    /// call: for every draft slot, the token its request emits if that position is the first
    /// rejected one, whether or not verification reaches it. The layout and the bits are those
    /// of [`recovered_tokens`](super::recovered_tokens): one value per draft slot ([`draft_slots`]), padded
    /// `recovered[b·k_max + j]` with [`SENTINEL`] for `j ≥ k_b`, ragged `recovered[cu[b−1] + j]`
    /// (a request with `k = 0` has no slot). The same random draws as the emitted tokens, so
    /// at a request's first rejected position it equals the emitted token.
    ///
    /// Validation checks its length ([`VerifyError::Length`] with [`Param::Recovered`], after
    /// the other outputs) and that the backend fills it ([`Support::recovered`](super::Support::recovered), else
    /// [`VerifyError::Unsupported`] with [`Feature::Recovered`](super::Feature::Recovered)); on error nothing is written.
    ///
    /// For host outputs: outputs on the device name theirs in [`DeviceOutputs::recovered`].
    /// Called on them, this gives host outputs that hold `recovered` alone (the device views
    /// are let go), which validation refuses as any host outputs of the wrong lengths
    /// ([`VerifyError::Length`] with [`Param::Accepted`]): host and device outputs are never
    /// mixed.
    ///
    /// ```
    /// use specula_core::verify::{verify_batch, AcceptedOut, Batch, Check, Dims, Drafts, Method, Outputs, Streams, TokensOut, SENTINEL};
    /// use specula_core::Counters;
    /// // V = 3, k_max = 2: request 0 drafts [1, 2], request 1 drafts [0].
    /// let target = [
    ///     0.0, 1.0, 0.0, /* */ 1.0, 0.0, 0.0, /* bonus */ 0.0, 0.0, 1.0, // request 0
    ///     0.0, 0.0, 1.0, /* */ 0.0, 1.0, 0.0, /* unused */ 0.0, 0.0, 0.0, // request 1
    /// ];
    /// let batch = Batch::dense(
    ///     Dims { vocab: 3, k_max: 2 },
    ///     Drafts { k: &[2, 1], ids: &[1, 2, 0, 0] },
    ///     &target,
    ///     Streams { seed: &[1, 2], offset: &[0, 0] },
    /// );
    /// let (mut accepted, mut tokens, mut recovered) = ([0u32; 2], [0u32; 6], [0u32; 4]);
    /// let mut out = Outputs::new(AcceptedOut(&mut accepted), TokensOut(&mut tokens))
    ///     .with_recovered(&mut recovered);
    /// verify_batch(Method::Greedy, Check::STRICT, &batch, &mut out, &mut Counters::<4>::ZERO)?;
    /// assert_eq!(accepted, [1, 0]);
    /// assert_eq!(tokens, [1, 0, SENTINEL, /* */ 2, SENTINEL, SENTINEL]);
    /// // Greedy: each slot's argmax; request 1 has one draft slot, the other is SENTINEL.
    /// assert_eq!(recovered, [1, 0, /* */ 2, SENTINEL]);
    /// # Ok::<(), specula_core::verify::VerifyError>(())
    /// ```
    #[must_use]
    pub fn with_recovered(self, recovered: &'a mut [u32]) -> Self {
        let (accepted, tokens) = match self {
            Self::Host {
                accepted, tokens, ..
            } => (accepted, tokens),
            Self::Device { .. } => (&mut [][..], &mut [][..]),
        };
        Self::Host {
            accepted,
            tokens,
            recovered: Some(recovered),
        }
    }

    /// The host slices (`accepted`, `tokens`, `recovered` when asked for), named so they cannot
    /// be swapped: what a host verifier writes after validation. Device outputs are
    /// [`VerifyError::Unsupported`] with [`Feature::Device`](super::Feature::Device) (what
    /// validation without [`Support::device`](super::Support::device) refuses them with).
    ///
    /// # Errors
    /// [`VerifyError::Unsupported`] for outputs on the device.
    pub fn host(
        &mut self,
    ) -> Result<(AcceptedOut<'_>, TokensOut<'_>, Option<&mut [u32]>), VerifyError> {
        match self {
            Self::Host {
                accepted,
                tokens,
                recovered,
            } => Ok((
                AcceptedOut(accepted),
                TokensOut(tokens),
                recovered.as_deref_mut(),
            )),
            Self::Device { .. } => Err(VerifyError::Unsupported {
                feature: super::Feature::Device,
            }),
        }
    }

    /// What these buffers ask a step to produce.
    #[must_use]
    pub fn produce(&self) -> Produce {
        Produce {
            recovered: match self {
                Self::Host { recovered, .. } => recovered.is_some(),
                Self::Device { outputs } => outputs.recovered.is_some(),
            },
        }
    }
}

/// What a verification step produces, as one value: the accepted counts and tokens always, and
/// the optional outputs it names. The GPU path's staging sizes its buffers by it, its launch
/// writes what it names and its download copies that ([`Outputs::produce`] is the host buffers'
/// own); a new output is a field here, not a new method pair on each of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub struct Produce {
    /// vLLM's recovered tokens, one per draft slot ([`Outputs::with_recovered`]).
    pub recovered: bool,
}

impl Produce {
    /// Accepted counts and tokens only.
    pub const TOKENS: Self = Self { recovered: false };
    /// Accepted counts, tokens and the recovered tokens.
    pub const WITH_RECOVERED: Self = Self { recovered: true };
}

/// Converts emitted tokens (`B · (k_max+1)` values, [`SENTINEL`]-padded, as in
/// [`Outputs::Host`]'s `tokens`) into vLLM's `output_token_ids` layout: `[B, k_max+1]` `i32`,
/// `-1`-padded.
///
/// Errors: [`VerifyError::Length`] ([`Param::Tokens`]) if `vllm` is not as long as `tokens`;
/// [`VerifyError::VllmTokenRange`] if a token does not fit an `i32` (nothing is written then).
///
/// ```
/// use specula_core::verify::{to_vllm_tokens, SENTINEL};
/// let mut out = [0i32; 4];
/// to_vllm_tokens(&[5, 9, 2, SENTINEL], &mut out).unwrap();
/// assert_eq!(out, [5, 9, 2, -1]);
/// ```
pub fn to_vllm_tokens(tokens: &[u32], vllm: &mut [i32]) -> Result<(), VerifyError> {
    if vllm.len() != tokens.len() {
        return Err(VerifyError::Length {
            param: Param::Tokens,
            len: vllm.len(),
            expected: tokens.len(),
        });
    }
    if let Some(index) = tokens
        .iter()
        .position(|&t| t != SENTINEL && i32::try_from(t).is_err())
    {
        return Err(VerifyError::VllmTokenRange {
            index,
            token: tokens[index],
        });
    }
    for (o, &t) in vllm.iter_mut().zip(tokens) {
        // Checked above: every non-sentinel token fits.
        *o = if t == SENTINEL { -1 } else { t as i32 };
    }
    Ok(())
}

/// Converts recovered tokens (as [`Outputs::with_recovered`] and [`recovered_tokens`](super::recovered_tokens) lay them
/// out for `batch`) into vLLM's `recovered_token_ids`: flat `[num_tokens]` `i32`, request after
/// request, `k_b` values each. The ragged layout already is that order (a plain conversion);
/// the padded one is packed, its [`SENTINEL`] slots (`j ≥ k_b`) dropped.
///
/// Errors (nothing is written then): [`VerifyError::Length`] with [`Param::Recovered`] if
/// `recovered` does not hold one value per draft slot ([`draft_slots`]), or if `vllm` is not
/// `num_tokens = Σ k_b` long (`expected` tells which); [`VerifyError::DraftLength`] if a padded
/// `k_b` exceeds `k_max`; [`VerifyError::VllmTokenRange`] if a token does not fit an `i32`
/// (`index` into `recovered`).
///
/// ```
/// use specula_core::verify::{to_vllm_recovered, Batch, Dims, Drafts, Streams, SENTINEL};
/// let target = [0.0f32; 2 * 3 * 4]; // V = 4, k_max = 2, two requests
/// let batch = Batch::dense(
///     Dims { vocab: 4, k_max: 2 },
///     Drafts { k: &[2, 1], ids: &[1, 2, 3, 0] },
///     &target,
///     Streams { seed: &[1, 2], offset: &[0, 0] },
/// );
/// let mut vllm = [0i32; 3];
/// to_vllm_recovered(&batch, &[3, 0, 2, SENTINEL], &mut vllm).unwrap();
/// assert_eq!(vllm, [3, 0, 2]);
/// ```
pub fn to_vllm_recovered(
    batch: &Batch<'_>,
    recovered: &[u32],
    vllm: &mut [i32],
) -> Result<(), VerifyError> {
    let slots = draft_slots(batch);
    if recovered.len() != slots {
        return Err(VerifyError::Length {
            param: Param::Recovered,
            len: recovered.len(),
            expected: slots,
        });
    }
    let ragged = batch.is_ragged();
    let mut tokens = slots;
    if !ragged {
        tokens = 0;
        for (request, &k) in batch.k().iter().enumerate() {
            if k as usize > batch.k_max {
                return Err(VerifyError::DraftLength {
                    request,
                    k,
                    k_max: batch.k_max,
                });
            }
            tokens += k as usize;
        }
    }
    if vllm.len() != tokens {
        return Err(VerifyError::Length {
            param: Param::Recovered,
            len: vllm.len(),
            expected: tokens,
        });
    }
    // Request b's values start at `b·k_max` (padded; `k_b` of them, in bounds as `k_b ≤ k_max`
    // and `recovered` holds `B·k_max`); the ragged ones are all of `recovered`, in order.
    let segments = if ragged { 1 } else { batch.k().len() };
    let segment = |b: usize| {
        if ragged {
            (0, recovered)
        } else {
            let start = b * batch.k_max;
            (start, &recovered[start..start + batch.k()[b] as usize])
        }
    };
    // Range check first, so nothing is written on error.
    for b in 0..segments {
        let (start, values) = segment(b);
        if let Some(j) = values.iter().position(|&t| i32::try_from(t).is_err()) {
            return Err(VerifyError::VllmTokenRange {
                index: start + j,
                token: values[j],
            });
        }
    }
    let mut out = vllm.iter_mut();
    for b in 0..segments {
        for (&t, o) in segment(b).1.iter().zip(&mut out) {
            // Checked above: every token fits.
            *o = t as i32;
        }
    }
    Ok(())
}
