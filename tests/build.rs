//! Compiles the GPU kernel text (`core/kernels/specula_verify.cu`) for the host, over the shim in
//! `tests/kernel_host/`, twice: in CUDA-macro mode (warp 32, `__shfl_down_sync`) and in HIP-macro
//! mode (wave 64, `__shfl_down`). `specula_tests::kernel_host` calls the two launchers, so CI runs
//! the exact kernel text on the CPU and compares it bit for bit with the Rust reference.

fn main() {
    let kernel = "../core/kernels/specula_verify.cu";
    let tree = "../core/kernels/specula_tree.cu";
    let shim = "kernel_host/shim.hpp";
    let launcher = "kernel_host/launch.cpp";
    for path in [kernel, tree, shim, launcher] {
        println!("cargo:rerun-if-changed={path}");
    }
    for (lib, hip) in [
        ("specula_kernel_host_cuda", false),
        ("specula_kernel_host_hip", true),
    ] {
        let mut build = cc::Build::new();
        build
            .cpp(true)
            .file(launcher)
            .std("c++20")
            // The kernel's numerics rely on IEEE binary32 with no contraction into FMA and no
            // fast-math reassociation, exactly as NVRTC's `--fmad=false` gives on the device.
            // Optimise even in debug builds: the shim runs a fiber per GPU thread.
            .opt_level(2)
            .flag("-ffp-contract=off")
            .flag("-fno-fast-math")
            // The kernel loads rows through `float4` pointers, as GPU code does.
            .flag("-fno-strict-aliasing")
            .define("SPECULA_BLOCK_THREADS", "128")
            .warnings(true)
            .extra_warnings(true);
        if hip {
            build.define("SPECULA_HIP", None);
        }
        build.compile(lib);
    }
    // std::mutex needs the platform thread library on some libcs.
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-lib=pthread");
    }
}
