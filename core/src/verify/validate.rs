//! Input validation: everything is checked before anything is verified or counted.

use super::{
    Batch, Check, DeviceOut, Feature, Format, Half, MAX_POSITIONS, Method, NO_DRAFT_ROWS, Outputs,
    Param, Rows, Support, Target, Tensor, Values, VerifyError, bf16_to_f32, f16_to_f32,
};

/// Mixed drafters: every request with rows has its `k_b` rows inside the tensor (`len` values
/// of stride `stride`): the last one's `V` values end by `len`.
fn mixed_rows_fit(
    batch: &Batch<'_>,
    first: &[u32],
    stride: usize,
    len: usize,
) -> Result<(), VerifyError> {
    for (b, &f) in first.iter().enumerate() {
        let k = batch.draft_len(b) as usize;
        if f == NO_DRAFT_ROWS || k == 0 {
            continue;
        }
        let need = (f as usize)
            .checked_add(k - 1)
            .and_then(|last| last.checked_mul(stride))
            .and_then(|at| at.checked_add(batch.vocab));
        if need.is_none_or(|n| n > len) {
            return Err(VerifyError::Length {
                param: Param::DraftProbs,
                len,
                expected: need.unwrap_or(usize::MAX),
            });
        }
    }
    Ok(())
}

// The checks below are shared by chains (this file) and trees (`tree/validate.rs`): one
// rule, one error, whichever step kind reads the input.

/// `len` is `expected`; `None` (an overflowing layout size, which no real slice matches) is
/// reported as `usize::MAX`.
pub(super) fn expect_len(
    param: Param,
    len: usize,
    expected: Option<usize>,
) -> Result<(), VerifyError> {
    let expected = expected.unwrap_or(usize::MAX);
    if len == expected {
        Ok(())
    } else {
        Err(VerifyError::Length {
            param,
            len,
            expected,
        })
    }
}

/// The rows' stride is at least `V`.
pub(super) fn stride_fits(rows: Rows<'_>, vocab: usize, tensor: Tensor) -> Result<(), VerifyError> {
    if rows.stride < vocab {
        return Err(VerifyError::StrideTooSmall {
            tensor,
            stride: rows.stride,
            vocab,
        });
    }
    Ok(())
}

/// `rows` hold `slots` rows: a stride `≥ V` and `slots · stride` values ([`Values::len`], any
/// memory).
pub(super) fn rows_fit(
    rows: Rows<'_>,
    vocab: usize,
    slots: Option<usize>,
    tensor: Tensor,
    param: Param,
) -> Result<(), VerifyError> {
    stride_fits(rows, vocab, tensor)?;
    let need = slots.and_then(|s| s.checked_mul(rows.stride));
    expect_len(param, rows.values.len(), need)
}

/// The target holds `slots` rows ([`rows_fit`], named as probabilities or logits).
pub(super) fn target_fits(
    target: Target<'_>,
    vocab: usize,
    slots: Option<usize>,
) -> Result<(), VerifyError> {
    let param = match target {
        Target::Probs(_) => Param::TargetProbs,
        Target::Logits { .. } => Param::TargetLogits,
    };
    rows_fit(target.rows(), vocab, slots, Tensor::Target, param)
}

/// The per-request streams and typical-acceptance parameters hold `b` values each.
pub(super) fn streams_fit(
    b: usize,
    seed: &[u64],
    offset: &[u64],
    eps: Option<&[f32]>,
    delta: Option<&[f32]>,
) -> Result<(), VerifyError> {
    expect_len(Param::Seed, seed.len(), Some(b))?;
    expect_len(Param::Offset, offset.len(), Some(b))?;
    if let Some(e) = eps {
        expect_len(Param::Eps, e.len(), Some(b))?;
    }
    if let Some(d) = delta {
        expect_len(Param::Delta, d.len(), Some(b))?;
    }
    Ok(())
}

/// A token is an id `< V`, else [`VerifyError::TokenOutOfRange`] at `position`.
pub(super) fn check_token(
    request: usize,
    position: usize,
    token: u32,
    vocab: usize,
) -> Result<(), VerifyError> {
    if token as usize >= vocab {
        return Err(VerifyError::TokenOutOfRange {
            request,
            position,
            token,
            vocab,
        });
    }
    Ok(())
}

/// A parameter in `[0, +∞)` (NaN refused), else [`VerifyError::BadParam`].
fn check_param(request: usize, param: Param, x: f32) -> Result<(), VerifyError> {
    if (0.0..f32::INFINITY).contains(&x) {
        Ok(())
    } else {
        Err(VerifyError::BadParam { request, param })
    }
}

/// A request's temperature (logits only) in `[0, +∞)`.
pub(super) fn check_temperature(request: usize, t: Option<f32>) -> Result<(), VerifyError> {
    t.map_or(Ok(()), |t| check_param(request, Param::Temperature, t))
}

/// Typical acceptance's `ε` and `δ` in `[0, +∞)` (checked where the request is verified by
/// [`Method::Typical`] only).
pub(super) fn check_typical(request: usize, eps: f32, delta: f32) -> Result<(), VerifyError> {
    check_param(request, Param::Eps, eps)?;
    check_param(request, Param::Delta, delta)
}

/// The strict check reads rows on the host: rows in device memory would need a copy down and
/// a wait, so they are refused ([`Feature::DeviceCheck`]), not skipped.
pub(super) fn rows_readable(has_device: bool) -> Result<(), VerifyError> {
    if has_device {
        return Err(VerifyError::Unsupported {
            feature: Feature::DeviceCheck,
        });
    }
    Ok(())
}

/// [`Check::Strict`]'s reading of request `request`'s rows of `tensor` at `positions` (draft
/// positions of a chain, nodes of a tree), each found by `row` (`None`: no such row, nothing
/// read) and checked by [`check_row`] with `tolerance`.
pub(super) fn check_rows<'v>(
    request: usize,
    tensor: Tensor,
    positions: core::ops::Range<usize>,
    tolerance: Option<f32>,
    row: impl Fn(usize) -> Option<Values<'v>>,
) -> Result<(), VerifyError> {
    for position in positions {
        if let Some(values) = row(position) {
            let at = RowAt {
                request,
                tensor,
                position,
            };
            check_row(values, tolerance, at)?;
        }
    }
    Ok(())
}

/// Where a checked row lies, for its error: request, tensor, and the row's draft position
/// (chains) or node (trees).
#[derive(Clone, Copy)]
struct RowAt {
    request: usize,
    tensor: Tensor,
    position: usize,
}

/// The strict check of one host row in any format, read as its exact binary32 widening (the
/// values a verifier reads): probabilities (`Some(tolerance)`: each in `[0, +∞)`, the sum
/// within `tolerance` of 1), or logits (`None`: no NaN, no `+∞`; `−∞` masks a token).
fn check_row(row: Values<'_>, tolerance: Option<f32>, at: RowAt) -> Result<(), VerifyError> {
    // One loop per format (monomorphised): the binary32 check stays a plain slice loop.
    match row {
        Values::F32(x) => check_values(x.iter().copied(), tolerance, at),
        Values::Half(Half::Bf16(x)) => {
            check_values(x.iter().map(|&v| bf16_to_f32(v)), tolerance, at)
        }
        Values::Half(Half::F16(x)) => check_values(x.iter().map(|&v| f16_to_f32(v)), tolerance, at),
        // Refused before any row is read (`rows_readable`).
        Values::Device(_) => Err(VerifyError::Unsupported {
            feature: Feature::DeviceCheck,
        }),
    }
}

fn check_values(
    mut row: impl Iterator<Item = f32>,
    tolerance: Option<f32>,
    at: RowAt,
) -> Result<(), VerifyError> {
    let RowAt {
        request,
        tensor,
        position,
    } = at;
    let Some(tolerance) = tolerance else {
        return match row.position(|l| l.is_nan() || l == f32::INFINITY) {
            Some(index) => Err(VerifyError::BadLogit {
                request,
                position,
                index,
            }),
            None => Ok(()),
        };
    };
    let mut sum = 0f64;
    for (index, p) in row.enumerate() {
        // NaN is in no range, so this refuses NaN, negatives and +∞.
        if !(0.0..f32::INFINITY).contains(&p) {
            return Err(VerifyError::BadProbability {
                request,
                tensor,
                position,
                index,
            });
        }
        sum += f64::from(p);
    }
    let dev = sum - 1.0;
    // Written so a NaN tolerance fails every row rather than passing them.
    if !(dev <= f64::from(tolerance) && -dev <= f64::from(tolerance)) {
        return Err(VerifyError::RowSum {
            request,
            tensor,
            position,
            sum,
        });
    }
    Ok(())
}

/// The batch-wide checks of the padded layout with `k ≥ 1` ([`Support::PADDED`], what every
/// backend verifies): [`validate_shape_with`].
pub fn validate_shape<const K: usize>(
    batch: &Batch<'_>,
    out: &Outputs<'_>,
) -> Result<(), VerifyError> {
    validate_shape_with::<K>(Support::PADDED, batch, out)
}

/// The batch-wide checks for a backend that supports `support`: the layout features, sizes,
/// strides and every slice length (inputs, then outputs: `accepted`, `tokens`, and
/// `recovered` when set, which needs [`Support::recovered`]; outputs on the device
/// ([`Outputs::on_device`]) need [`Support::device`] and are checked the same way). Tensors
/// in device memory ([`Values::Device`]) need [`Support::device`]. `O(B)` for the ragged
/// layout, `O(1)` otherwise; afterwards every row index the verifier computes is in bounds and
/// cannot overflow.
pub fn validate_shape_with<const K: usize>(
    support: Support,
    batch: &Batch<'_>,
    out: &Outputs<'_>,
) -> Result<(), VerifyError> {
    validate_inputs_with::<K>(support, batch)?;
    let b = batch.requests();
    let out_slots = batch.k_max.checked_add(1).and_then(|w| w.checked_mul(b));
    let (accepted, tokens, recovered) = match out {
        Outputs::Host {
            accepted,
            tokens,
            recovered,
        } => (
            accepted.len(),
            tokens.len(),
            recovered.as_deref().map(<[u32]>::len),
        ),
        Outputs::Device { outputs } => {
            if !support.device {
                return Err(VerifyError::Unsupported {
                    feature: Feature::Device,
                });
            }
            let recovered = outputs.recovered.as_ref().map(DeviceOut::len);
            (outputs.accepted.len(), outputs.tokens.len(), recovered)
        }
    };
    expect_len(Param::Accepted, accepted, Some(b))?;
    expect_len(Param::Tokens, tokens, out_slots)?;
    if let Some(r) = recovered {
        recovered_supported(support)?;
        expect_len(Param::Recovered, r, Some(draft_slots(batch)))?;
    }
    Ok(())
}

fn recovered_supported(support: Support) -> Result<(), VerifyError> {
    if support.recovered {
        Ok(())
    } else {
        Err(VerifyError::Unsupported {
            feature: Feature::Recovered,
        })
    }
}

/// The number of draft slots of `batch` (`B · k_max` padded, `num_tokens` ragged), for a
/// batch that passed [`validate_shape_with`] (or its input part).
#[must_use]
pub fn draft_slots(batch: &Batch<'_>) -> usize {
    match batch.cu_num_draft_tokens() {
        Some(cu) => cu.last().map_or(0, |&c| c as usize),
        None => batch.requests().saturating_mul(batch.k_max),
    }
}

/// [`validate_shape_with`] without the outputs.
pub(crate) fn validate_inputs_with<const K: usize>(
    support: Support,
    batch: &Batch<'_>,
) -> Result<(), VerifyError> {
    if batch.is_ragged() && !support.ragged {
        return Err(VerifyError::Unsupported {
            feature: Feature::Ragged,
        });
    }
    if batch.bonus.is_some() && !support.bonus {
        return Err(VerifyError::Unsupported {
            feature: Feature::Bonus,
        });
    }
    if batch.has_logits() && !support.logits {
        return Err(VerifyError::Unsupported {
            feature: Feature::Logits,
        });
    }
    if batch.has_half() && !support.half {
        return Err(VerifyError::Unsupported {
            feature: Feature::Half,
        });
    }
    if !batch.has_logits() && batch.target.rows().format() != Format::F32 && !support.half_probs {
        return Err(VerifyError::Unsupported {
            feature: Feature::HalfProbs,
        });
    }
    if batch.has_device() && !support.device {
        return Err(VerifyError::Unsupported {
            feature: Feature::Device,
        });
    }
    if batch.methods.is_some() && !support.methods {
        return Err(VerifyError::Unsupported {
            feature: Feature::Methods,
        });
    }
    if batch.filters.is_some() && !support.filters {
        return Err(VerifyError::Unsupported {
            feature: Feature::Filters,
        });
    }
    let b = batch.requests();
    if b == 0 {
        return Err(VerifyError::EmptyBatch);
    }
    let max = K.min(MAX_POSITIONS);
    if (batch.k_max == 0 && !support.empty_drafts) || batch.k_max > max {
        return Err(VerifyError::KMaxOutOfRange {
            k_max: batch.k_max,
            max,
        });
    }
    let v = batch.vocab;
    // Ids are u32 and u32::MAX is the sentinel, so every id < V must stay below it.
    if v == 0 || v > u32::MAX as usize {
        return Err(VerifyError::VocabOutOfRange { vocab: v });
    }
    let (draft_slots, target_rows) = match batch.cu_num_draft_tokens() {
        Some(cu) => {
            let mut prev = 0u32;
            for (request, &c) in cu.iter().enumerate() {
                if c < prev {
                    return Err(VerifyError::CumulativeDecreases { request });
                }
                prev = c;
            }
            let tokens = prev as usize;
            let rows = if batch.bonus.is_some() {
                Some(tokens)
            } else {
                tokens.checked_add(b)
            };
            (Some(tokens), rows)
        }
        None => (
            b.checked_mul(batch.k_max),
            batch.k_max.checked_add(1).and_then(|w| w.checked_mul(b)),
        ),
    };
    expect_len(Param::DraftIds, batch.draft_ids.len(), draft_slots)?;
    if let Some(d) = batch.draft {
        match d.first_row {
            None => rows_fit(d.rows, v, draft_slots, Tensor::Draft, Param::DraftProbs)?,
            // Mixed drafters: each request's rows inside the tensor (checked per request, as
            // the tensor holds only the rows of the requests that have them).
            Some(first) => {
                stride_fits(d.rows, v, Tensor::Draft)?;
                expect_len(Param::DraftFirstRow, first.len(), Some(b))?;
                mixed_rows_fit(batch, first, d.rows.stride, d.rows.values.len())?;
            }
        }
    }
    target_fits(batch.target, v, target_rows)?;
    streams_fit(b, batch.seed, batch.offset, batch.eps, batch.delta)?;
    if let Some(x) = batch.bonus {
        expect_len(Param::Bonus, x.len(), Some(b))?;
    }
    if let Some(t) = batch.target.temperature() {
        expect_len(Param::Temperature, t.len(), Some(b))?;
    }
    if let Some(f) = batch.filters {
        expect_len(Param::Filters, f.len(), Some(b))?;
    }
    if let Some(x) = batch.methods {
        expect_len(Param::Methods, x.len(), Some(b))?;
    }
    Ok(())
}

/// [`validate_request_with`] for the padded layout with `k ≥ 1` ([`Support::PADDED`]).
pub fn validate_request(
    method: Method,
    check: Check,
    batch: &Batch<'_>,
    b: usize,
) -> Result<(), VerifyError> {
    validate_request_with(Support::PADDED, method, check, batch, b)
}

/// The checks of request `b` of a batch that passed [`validate_shape_with`] (same `support`):
/// its draft length, its token ids, its bonus token, its typical-acceptance parameters (for
/// [`Method::Typical`]) and, for [`Check::Strict`], every probability it will read.
pub fn validate_request_with(
    support: Support,
    method: Method,
    check: Check,
    batch: &Batch<'_>,
    b: usize,
) -> Result<(), VerifyError> {
    let k = batch.draft_len(b);
    if (k == 0 && !support.empty_drafts) || k as usize > batch.k_max {
        return Err(VerifyError::DraftLength {
            request: b,
            k,
            k_max: batch.k_max,
        });
    }
    let k = k as usize;
    // Validated shape and `k ≤ k_max`: the ids are inside the slice.
    let ids = batch.draft_ids_checked(b).unwrap_or(&[]);
    for (position, &token) in ids.iter().enumerate() {
        check_token(b, position, token, batch.vocab)?;
    }
    if let Some(bonus) = batch.bonus {
        check_token(b, k, bonus[b], batch.vocab)?;
    }
    check_temperature(b, batch.temperature_of(b))?;
    if let Some(param) = batch.filter_of(b).out_of_range() {
        return Err(VerifyError::BadParam { request: b, param });
    }
    if batch.method_of(b, method) == Method::Typical {
        check_typical(b, batch.eps_of(b), batch.delta_of(b))?;
    }
    if let Check::Strict { sum_tolerance } = check {
        rows_readable(batch.has_device())?;
        // Only rows a method can read: draft rows 0..k, target rows 0..=k (never the padding;
        // row k only when the bonus is sampled).
        let draft = |j| batch.draft_values_checked(b, j);
        check_rows(b, Tensor::Draft, 0..k, Some(sum_tolerance), draft)?;
        let tolerance = (!batch.has_logits()).then_some(sum_tolerance);
        let rows = if batch.bonus.is_some() { k } else { k + 1 };
        let target = |j| batch.target_values_checked(b, j);
        check_rows(b, Tensor::Target, 0..rows, tolerance, target)?;
    }
    Ok(())
}

/// Every check of [`validate_with`] for a [`recovered_tokens`](super::recovered_tokens) call:
/// the inputs, every request, and `recovered` holding one slot per draft slot
/// ([`draft_slots`]).
pub fn validate_recovered<const K: usize>(
    support: Support,
    method: Method,
    check: Check,
    batch: &Batch<'_>,
    recovered: &[u32],
) -> Result<(), VerifyError> {
    validate_inputs_with::<K>(support, batch)?;
    expect_len(Param::Recovered, recovered.len(), Some(draft_slots(batch)))?;
    for b in 0..batch.requests() {
        validate_request_with(support, method, check, batch, b)?;
    }
    Ok(())
}

/// Every check for the padded layout with `k ≥ 1` ([`Support::PADDED`], what every backend,
/// the GPU kernels included, verifies): [`validate_with`].
pub fn validate<const K: usize>(
    method: Method,
    check: Check,
    batch: &Batch<'_>,
    out: &Outputs<'_>,
) -> Result<(), VerifyError> {
    validate_with::<K>(Support::PADDED, method, check, batch, out)
}

/// Every check for a backend that supports `support`, in the documented order:
/// [`validate_shape_with`], then [`validate_request_with`] for each request in batch order.
/// `Ok` means the batch can be verified without any failure.
pub fn validate_with<const K: usize>(
    support: Support,
    method: Method,
    check: Check,
    batch: &Batch<'_>,
    out: &Outputs<'_>,
) -> Result<(), VerifyError> {
    validate_shape_with::<K>(support, batch, out)?;
    for b in 0..batch.requests() {
        validate_request_with(support, method, check, batch, b)?;
    }
    Ok(())
}
