//! bf16 / f16 tensors from the `half` crate as verification inputs: the engine's own
//! `&[half::bf16]` logits or `&[half::f16]` draft probabilities, viewed (no copy) as the 16-bit
//! patterns [`Half`] holds.
//!
//! ```
//! use specula::half::bf16;
//! use specula::half_tensors;
//! use specula::specula_core::verify::Values;
//! let logits = [bf16::from_f32(1.5), bf16::from_f32(-2.0)];
//! let v = Values::Half(half_tensors::bf16(&logits));
//! assert_eq!((v.at(0), v.at(1)), (1.5, -2.0));
//! ```

use half::slice::HalfFloatSliceExt;
use specula_core::verify::Half;

/// A bf16 tensor as [`Half::Bf16`] (the same memory).
#[must_use]
pub fn bf16(x: &[half::bf16]) -> Half<'_> {
    Half::Bf16(x.reinterpret_cast())
}

/// An f16 tensor as [`Half::F16`] (the same memory).
#[must_use]
pub fn f16(x: &[half::f16]) -> Half<'_> {
    Half::F16(x.reinterpret_cast())
}
