//! bf16 / f16 tree rows on the CPU backend: widened exactly into binary32 scratch before the
//! tree is walked, so the control flow and its reductions read binary32 rows and give the bits
//! of the tree of the widened rows (the widening is exact, `core/DETERMINISM.md`).
//!
//! Every row is widened, not only those the walk reads (the walk decides which rows it reads as
//! it goes): one pass over the batch's half rows, spread over the pool, and `B · N · stride`
//! binary32 values of scratch per half tensor. (Not measured against a read-only pass yet.)

use rayon::prelude::*;
use specula_core::verify::tree::TreeBatch;
use specula_core::verify::{Format, Rows};

/// Values per piece of the parallel widening.
const PIECE: usize = 1 << 16;

/// The binary32 widening of a batch's half rows (`None`: that tensor is binary32 already).
pub(super) struct Widened {
    target: Option<Vec<f32>>,
    draft: Option<Vec<f32>>,
}

impl Widened {
    /// The widened rows of a validated host batch, or `None` when every row is binary32.
    pub(super) fn of(batch: &TreeBatch<'_>, pool: Option<&rayon::ThreadPool>) -> Option<Self> {
        let target = widen(batch.target.rows(), pool);
        let draft = batch.draft.and_then(|d| widen(d, pool));
        if target.is_none() && draft.is_none() {
            None
        } else {
            Some(Self { target, draft })
        }
    }

    /// `batch` with its half rows replaced by the widened ones (same strides).
    pub(super) fn batch<'s>(&'s self, batch: &TreeBatch<'s>) -> TreeBatch<'s> {
        let mut out = *batch;
        if let Some(t) = &self.target {
            out.target = batch
                .target
                .with_rows(Rows::f32(t, batch.target.rows().stride));
        }
        if let (Some(d), Some(r)) = (&self.draft, batch.draft) {
            out.draft = Some(Rows::f32(d, r.stride));
        }
        out
    }
}

/// Every value of `rows` widened (padding between rows included, so the stride stays), or
/// `None` for binary32 rows. Host values only (validated: device rows were refused).
fn widen(rows: Rows<'_>, pool: Option<&rayon::ThreadPool>) -> Option<Vec<f32>> {
    if rows.format() == Format::F32 {
        return None;
    }
    let values = rows.values;
    let mut out = vec![0f32; values.len()];
    let piece = |(i, o): (usize, &mut [f32])| {
        if let Some(v) = values.get(i * PIECE, o.len()) {
            v.widen_into(o);
        }
    };
    match pool {
        Some(pool) => pool.install(|| out.par_chunks_mut(PIECE).enumerate().for_each(piece)),
        None => out.chunks_mut(PIECE).enumerate().for_each(piece),
    }
    Some(out)
}
