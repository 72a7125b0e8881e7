//! Which x86-64 intrinsics this compiler has, for the CPU backend's hand-written kernels, so
//! the crate builds from its `rust-version` up (docs/RELEASING.md, "MSRV"):
//!
//! - `specula_avx2_intrinsics`: Rust 1.87 or newer, where `std::arch` intrinsics are safe to
//!   call inside a `#[target_feature]` function that enables them (the AVX2 write-out is written
//!   that way); older compilers use the portable write-out on AVX2 CPUs.
//! - `specula_avx512`: Rust 1.89 or newer, where the AVX-512 target features and intrinsics are
//!   stable; older compilers never pick `Isa::Avx512` and run the AVX2 kernels on AVX-512 CPUs.
//!
//! Both only on x86-64. The results are the same bits on every instruction set, so a compiler
//! below either line changes speed, never output.

use std::env;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(specula_avx2_intrinsics)");
    println!("cargo::rustc-check-cfg=cfg(specula_avx512)");
    // Cargo reruns the script when the compiler changes; nothing else it reads can.
    println!("cargo::rerun-if-changed=build.rs");
    if env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("x86_64") {
        return;
    }
    // autocfg asks the compiler Cargo builds the crate with (`RUSTC`, its wrapper and target).
    let ac = autocfg::new();
    if ac.probe_rustc_version(1, 87) {
        autocfg::emit("specula_avx2_intrinsics");
    }
    if ac.probe_rustc_version(1, 89) {
        autocfg::emit("specula_avx512");
    }
}
