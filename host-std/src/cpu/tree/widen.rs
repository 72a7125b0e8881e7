//! bf16 / f16 tree rows on the CPU backend: a [`NodeRows`] that widens a half row exactly into
//! binary32 scratch when the walk first reads it, so the walk hands binary32 rows to this
//! backend's vectorised reductions (the reference reads half rows in place, by plain loops)
//! and gives the bits of the tree of the widened rows (the widening is exact,
//! `core/DETERMINISM.md`; f16 rows with the vectorising widening of the softmax kernels,
//! [`widen_into`](super::super::kernels::widen_into), the core's bits at half its cost).
//!
//! Only the rows the walk reads are widened (2–4 of a 17-node request's rows for greedy and
//! rejection sampling), each once per request, on the thread that verifies the request, into
//! buffers each thread keeps between requests and calls. Binary32 rows are read in place, as
//! [`BatchRows`] reads them.

use specula_core::verify::Values;
use specula_core::verify::tree::{BatchRows, NodeRows, TreeBatch};
use std::cell::{OnceCell, RefCell};

/// Spare row buffers a thread keeps between requests, at most: at V = 128256 each is 0.5 MB,
/// and a typical-acceptance walk over a wide tree may read hundreds of rows once.
const KEEP: usize = 32;

/// One request's widened rows, a cell per node slot, filled on first read; the buffers are
/// taken back for the next request ([`begin`](Self::begin)).
#[derive(Default)]
pub(super) struct Widening {
    /// The request whose rows the cells hold.
    request: usize,
    pub(super) target: Vec<OnceCell<Vec<f32>>>,
    pub(super) draft: Vec<OnceCell<Vec<f32>>>,
    /// Buffers of earlier requests' rows, reused before any is allocated.
    spare: RefCell<Vec<Vec<f32>>>,
}

impl Widening {
    /// Empties the cells (their buffers become spare) for request `b` of `batch`.
    pub(super) fn begin(&mut self, batch: &TreeBatch<'_>, b: usize) {
        let spare = self.spare.get_mut();
        for cell in self.target.iter_mut().chain(self.draft.iter_mut()) {
            spare.extend(cell.take());
        }
        spare.truncate(KEEP);
        self.request = b;
        // A cell per node for half rows only: binary32 rows are read in place.
        let slots = |v: Option<Values<'_>>| match v {
            Some(Values::Half(_)) => batch.max_nodes,
            _ => 0,
        };
        self.target
            .resize_with(slots(Some(batch.target.rows().values)), OnceCell::new);
        self.draft
            .resize_with(slots(batch.draft.map(|d| d.values)), OnceCell::new);
    }

    /// `row` widened into `cell` (on the first read; a spare buffer when there is one).
    fn widened<'s>(&'s self, cell: &'s OnceCell<Vec<f32>>, row: Values<'_>) -> &'s [f32] {
        cell.get_or_init(|| {
            let mut buf = self.spare.borrow_mut().pop().unwrap_or_default();
            // Every value is overwritten: resized (zeroed) only when the length changes.
            if buf.len() != row.len() {
                buf.clear();
                buf.resize(row.len(), 0.0);
            }
            super::super::kernels::widen_into(row, &mut buf);
            buf
        })
    }
}

impl NodeRows for Widening {
    fn target<'s>(&'s self, batch: &'s TreeBatch<'_>, b: usize, node: usize) -> Values<'s> {
        match (self.target.get(node), batch.target_values_checked(b, node)) {
            (Some(cell), Some(row)) => {
                debug_assert_eq!(b, self.request, "rows of another request");
                Values::F32(self.widened(cell, row))
            }
            _ => BatchRows.target(batch, b, node),
        }
    }

    fn draft<'s>(&'s self, batch: &'s TreeBatch<'_>, b: usize, node: usize) -> Option<Values<'s>> {
        match (self.draft.get(node), batch.draft_values_checked(b, node)) {
            (Some(cell), Some(row)) => {
                debug_assert_eq!(b, self.request, "rows of another request");
                Some(Values::F32(self.widened(cell, row)))
            }
            _ => BatchRows.draft(batch, b, node),
        }
    }
}
