//! Writes the PTX of the kernel text for one virtual architecture, compiled with the crate's
//! own NVRTC options (`specula_cuda::nvrtc_options`), for `scripts/kernel-report.py`.
//!
//! ```text
//! cargo run -p specula-cuda --example kernel_ptx -- compute_90 OUT.ptx [--pre PRE.cu] [EXTRA.cu ...]
//! ```
//! Each `EXTRA.cu` is appended to the kernel text (`specula_core::gpu::kernels::SOURCE`) before
//! compiling, so probe wrappers can call the kernel's device functions; `--pre` files go before
//! it (to define a hook macro such as `SP_COLD_MARK`). Exit status 2 when no NVRTC library
//! loads, 1 on any other failure.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [arch, out, extra @ ..] = args.as_slice() else {
        eprintln!("usage: kernel_ptx ARCH OUT.ptx [EXTRA.cu ...]");
        return ExitCode::from(1);
    };
    let (mut pre, mut post) = (String::new(), String::new());
    let mut files = extra.iter();
    while let Some(arg) = files.next() {
        let (dst, path) = if arg == "--pre" {
            let Some(path) = files.next() else {
                eprintln!("kernel_ptx: --pre needs a file");
                return ExitCode::from(1);
            };
            (&mut pre, path)
        } else {
            (&mut post, arg)
        };
        match std::fs::read_to_string(path) {
            Ok(text) => {
                dst.push_str("\n// ---- from ");
                dst.push_str(path);
                dst.push('\n');
                dst.push_str(&text);
                dst.push('\n');
            }
            Err(e) => {
                eprintln!("kernel_ptx: {path}: {e}");
                return ExitCode::from(1);
            }
        }
    }
    let source = format!("{pre}{}{post}", specula_core::gpu::kernels::SOURCE);
    match specula_cuda::compile_source_ptx(&source, "specula_verify.cu", arch) {
        Ok(ptx) => match std::fs::write(out, ptx) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("kernel_ptx: {out}: {e}");
                ExitCode::from(1)
            }
        },
        Err(specula_cuda::CudaError::NoNvrtc) => {
            eprintln!("kernel_ptx: no NVRTC library loads (source scripts/cuda-tools.sh)");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("kernel_ptx: {arch}: {e}");
            ExitCode::from(1)
        }
    }
}
