//! Half-precision inputs: bf16 and f16 rows, widened to binary32 exactly.
//!
//! The widening is hand-written (not the `half` crate) because the core is `no_std` without
//! dependencies beyond its own, and because it must match the kernel text bit for bit: both
//! conversions are exact (every bf16 and f16 value is a binary32 value), so any correct
//! implementation gives the same bits, and these few lines are the specification the kernel
//! follows (`core/DETERMINISM.md`, "Half-precision inputs").

use super::{Device, Format};

/// A half-precision tensor, as the raw 16-bit patterns the engine holds (a `&[half::bf16]`
/// or `&[half::f16]` reinterpreted; `specula` has helpers). The variant names the format, so
/// the two cannot be confused.
#[derive(Clone, Copy, Debug)]
pub enum Half<'a> {
    /// bfloat16: sign, 8 exponent bits, 7 mantissa bits (the high half of a binary32).
    Bf16(&'a [u16]),
    /// IEEE-754 binary16: sign, 5 exponent bits, 10 mantissa bits.
    F16(&'a [u16]),
}

impl<'a> Half<'a> {
    /// Number of values.
    #[must_use]
    pub const fn len(&self) -> usize {
        match self {
            Self::Bf16(x) | Self::F16(x) => x.len(),
        }
    }

    /// Whether there are no values.
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `len` values from `start`, `None` if outside.
    #[must_use]
    pub fn get(&self, start: usize, len: usize) -> Option<Self> {
        let end = start.checked_add(len)?;
        Some(match self {
            Self::Bf16(x) => Self::Bf16(x.get(start..end)?),
            Self::F16(x) => Self::F16(x.get(start..end)?),
        })
    }
}

/// One row (or tensor) of values in any of the input formats, read as binary32.
#[derive(Clone, Copy, Debug)]
pub enum Values<'a> {
    /// binary32.
    F32(&'a [f32]),
    /// bf16 or f16, widened exactly on read.
    Half(Half<'a>),
    /// Any of the formats in device memory, read in place by the GPU verifier of its driver and
    /// device (no host copy); host verifiers refuse it ([`Support::device`](super::Support::device)),
    /// and the readers below ([`at`](Self::at), [`for_each`](Self::for_each),
    /// [`widen_into`](Self::widen_into)) panic on it: validate first.
    Device(Device<'a>),
}

/// Device values cannot be read on the host (validation refuses them before any read).
#[cold]
#[track_caller]
fn on_device() -> ! {
    panic!("device values are not readable on the host (refused by validation)")
}

impl<'a> Values<'a> {
    /// Number of values.
    #[must_use]
    pub const fn len(&self) -> usize {
        match self {
            Self::F32(x) => x.len(),
            Self::Half(h) => h.len(),
            Self::Device(d) => d.len(),
        }
    }

    /// Whether there are no values.
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Value `i` as binary32 (exact). Panics if `i` is out of range or the values are in device
    /// memory.
    #[inline(always)]
    #[must_use]
    pub fn at(&self, i: usize) -> f32 {
        match self {
            Self::F32(x) => x[i],
            Self::Half(Half::Bf16(x)) => bf16_to_f32(x[i]),
            Self::Half(Half::F16(x)) => f16_to_f32(x[i]),
            Self::Device(_) => on_device(),
        }
    }

    /// `len` values from `start`, `None` if outside.
    #[must_use]
    pub fn get(&self, start: usize, len: usize) -> Option<Self> {
        match self {
            Self::F32(x) => Some(Self::F32(x.get(start..start.checked_add(len)?)?)),
            Self::Half(h) => h.get(start, len).map(Self::Half),
            Self::Device(d) => d.get(start, len).map(Self::Device),
        }
    }

    /// Calls `f` with every value in order, widened. Panics for values in device memory.
    #[inline]
    pub fn for_each(&self, mut f: impl FnMut(f32)) {
        match self {
            Self::F32(x) => x.iter().for_each(|&v| f(v)),
            Self::Half(Half::Bf16(x)) => x.iter().for_each(|&v| f(bf16_to_f32(v))),
            Self::Half(Half::F16(x)) => x.iter().for_each(|&v| f(f16_to_f32(v))),
            Self::Device(_) => on_device(),
        }
    }

    /// Writes the values, widened, into `out` (as long as `self`). Panics for values in device
    /// memory.
    pub fn widen_into(&self, out: &mut [f32]) {
        match self {
            Self::F32(x) => out.copy_from_slice(x),
            Self::Half(Half::Bf16(x)) => {
                for (o, &v) in out.iter_mut().zip(x.iter()) {
                    *o = bf16_to_f32(v);
                }
            }
            Self::Half(Half::F16(x)) => {
                for (o, &v) in out.iter_mut().zip(x.iter()) {
                    *o = f16_to_f32(v);
                }
            }
            Self::Device(_) => on_device(),
        }
    }

    /// The element format.
    #[must_use]
    pub const fn format(&self) -> Format {
        match self {
            Self::F32(_) => Format::F32,
            Self::Half(Half::Bf16(_)) => Format::Bf16,
            Self::Half(Half::F16(_)) => Format::F16,
            Self::Device(d) => d.format(),
        }
    }

    /// Whether the values are in device memory ([`Values::Device`]).
    #[must_use]
    pub const fn is_device(&self) -> bool {
        matches!(self, Self::Device(_))
    }
}

/// bfloat16 → binary32, exact: the 16 bits become the high half of the binary32 pattern
/// (NaN payloads included).
///
/// ```
/// use specula_core::verify::bf16_to_f32;
/// assert_eq!(bf16_to_f32(0x3F80), 1.0);
/// assert_eq!(bf16_to_f32(0xC040), -3.0);
/// ```
#[inline(always)]
#[must_use]
pub const fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// IEEE binary16 → binary32, exact (subnormals normalised; infinities and NaN keep their sign,
/// a NaN its payload shifted into the top of the binary32 mantissa).
///
/// ```
/// use specula_core::verify::f16_to_f32;
/// assert_eq!(f16_to_f32(0x3C00), 1.0);
/// assert_eq!(f16_to_f32(0x0001), f32::from_bits(0x3380_0000)); // 2⁻²⁴, the smallest subnormal
/// assert_eq!(f16_to_f32(0xFC00), f32::NEG_INFINITY);
/// ```
#[inline(always)]
#[must_use]
pub const fn f16_to_f32(bits: u16) -> f32 {
    let sign = ((bits as u32) & 0x8000) << 16;
    let exp = ((bits >> 10) & 0x1F) as u32;
    let man = (bits & 0x03FF) as u32;
    let out = if exp == 0x1F {
        // Infinity or NaN.
        0x7F80_0000 | (man << 13)
    } else if exp != 0 {
        // Normal: rebias 15 → 127.
        ((exp + 112) << 23) | (man << 13)
    } else if man == 0 {
        0
    } else {
        // Subnormal: man · 2⁻²⁴; shift the leading one into the implicit bit.
        let lz = man.leading_zeros() - 22; // zeros above bit 9 within the 10-bit field
        let m = (man << (lz + 1)) & 0x03FF;
        ((112 - lz) << 23) | (m << 13)
    };
    f32::from_bits(sign | out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `2ⁿ` exactly (Miri perturbs `powi` on purpose).
    fn two_to(n: i32) -> f64 {
        f64::from_bits(((1023 + n) as u64) << 52)
    }

    /// Every f16 pattern (every 97th under Miri) against an independent definition
    /// (value = m · 2^(e − 25) in f64).
    #[test]
    fn f16_widening_is_exact_for_every_pattern() {
        let step = if cfg!(miri) { 97 } else { 1 };
        for bits in (0..=u16::MAX).step_by(step) {
            let got = f16_to_f32(bits);
            let exp = i32::from((bits >> 10) & 0x1F);
            let man = f64::from(bits & 0x3FF);
            let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
            if exp == 0x1F {
                if man == 0.0 {
                    assert_eq!(got, sign as f32 * f32::INFINITY);
                } else {
                    assert!(got.is_nan());
                    assert_eq!(got.to_bits() & 0x7F_FFFF, u32::from(bits & 0x3FF) << 13);
                }
                continue;
            }
            let want = if exp == 0 {
                sign * man * two_to(-24)
            } else {
                sign * (1024.0 + man) * two_to(exp - 25)
            };
            assert_eq!(f64::from(got), want, "{bits:#06x}");
            assert_eq!(got.is_sign_negative(), bits & 0x8000 != 0, "{bits:#06x}");
        }
    }

    #[test]
    fn bf16_widening_is_the_high_half() {
        for bits in (0..=u16::MAX).step_by(97) {
            assert_eq!(bf16_to_f32(bits).to_bits() >> 16, u32::from(bits));
        }
    }
}
