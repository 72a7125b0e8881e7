//! The cross-crate tests of `specula-tests`, one module per subject, in one binary: one link
//! instead of one per file. The fast tier: each backend's run of the conformance suites (the
//! reference, the CPU backend, the kernel text executed on the host, the shared GPU orchestration
//! over the host driver; chains and token trees), the readback suite, recovered tokens, and the
//! bit-for-bit checks of logits and sampling filters. The sampling laws are the `statistics`
//! binary's.

mod gpu_device;
mod gpu_host;
mod gpu_host_inputs;
mod gpu_tree_device;
mod gpu_tree_host;
mod kernel_host;
mod kernel_host_inputs;
mod kernel_host_race_bound;
mod kernel_host_shim;
mod kernel_host_softmax;
mod readback_conformance;
mod recovered;
mod tree_half;
mod tree_kernel_host;
mod tree_verify;
mod verify_cpu;
mod verify_filters;
mod verify_logits;
mod verify_reference;
