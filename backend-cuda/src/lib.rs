//! CUDA backend of Specula: verification kernels with fused counters and asynchronous counter readback (cudarc, runtime NVRTC).
//!
//! Not implemented yet: see the crate README.
