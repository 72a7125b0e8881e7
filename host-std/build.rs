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
use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(specula_avx2_intrinsics)");
    println!("cargo::rustc-check-cfg=cfg(specula_avx512)");
    // Cargo reruns the script when the compiler changes; nothing else it reads can.
    println!("cargo::rerun-if-changed=build.rs");
    if env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("x86_64") {
        return;
    }
    let minor = rustc_minor().unwrap_or(0);
    if minor >= 87 {
        println!("cargo::rustc-cfg=specula_avx2_intrinsics");
    }
    if minor >= 89 {
        println!("cargo::rustc-cfg=specula_avx512");
    }
}

/// The minor version of the compiler Cargo builds the crate with (`rustc 1.89.0 (…)` → 89);
/// `None` if it cannot be run or read, and then neither intrinsic set is used.
fn rustc_minor() -> Option<u32> {
    let rustc = env::var_os("RUSTC")?;
    let out = Command::new(rustc).arg("--version").output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let version = text.strip_prefix("rustc ")?;
    let mut parts = version.split(['.', ' ', '-']);
    (parts.next()? == "1").then_some(())?;
    parts.next()?.parse().ok()
}
