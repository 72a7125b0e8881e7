//! ROCm backend of Specula: the same kernels and readback on AMD GPUs (HIP).
//!
//! Not implemented yet: see the crate README.
