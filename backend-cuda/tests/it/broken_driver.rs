//! A `libcuda` that loads but lacks the driver's entry points (a stub, a container's partial
//! shim) gives `CudaError::NoDriver`, never cudarc's panic on the first missing symbol.
//!
//! The driver check runs once per process, so the test re-runs this binary with the loader path
//! pointing at a folder whose `libcuda.so` and `libcuda.so.1` are a copy of the C maths library
//! (a real shared library without a single `cu*` symbol).

use specula_cuda::{CudaDevice, CudaError};
use std::path::PathBuf;
use std::process::Command;

const CHILD: &str = "SPECULA_BROKEN_DRIVER_CHILD";

/// A shared library of this system that surely is not a CUDA driver.
fn stand_in() -> Option<PathBuf> {
    [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6",
        "/usr/lib64/libm.so.6",
        "/lib/aarch64-linux-gnu/libm.so.6",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.is_file())
}

#[test]
fn a_driver_library_without_its_symbols_is_no_driver() {
    if std::env::var_os(CHILD).is_some() {
        // In the child: the stand-in is what loads as libcuda.
        assert!(!specula_cuda::driver_present());
        match CudaDevice::new(0) {
            Err(CudaError::NoDriver) => {}
            other => panic!("expected NoDriver, got {other:?}"),
        }
        return;
    }
    let Some(libm) = stand_in() else {
        eprintln!("SKIPPED: no libm.so.6 found to stand in for a broken libcuda");
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: stand-in missing"
        );
        return;
    };
    let dir = std::env::temp_dir().join(format!("specula-broken-libcuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["libcuda.so", "libcuda.so.1"] {
        std::fs::copy(&libm, dir.join(name)).unwrap();
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "broken_driver::a_driver_library_without_its_symbols_is_no_driver",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env("LD_LIBRARY_PATH", &dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed: {text}");
    assert!(text.contains("1 passed"), "the child ran the check: {text}");
}

#[test]
fn the_symbol_list_has_no_duplicates_and_names_the_entry_points() {
    let mut names = specula_cuda::DRIVER_SYMBOLS.to_vec();
    names.sort_unstable();
    let before = names.len();
    names.dedup();
    assert_eq!(names.len(), before);
    assert!(names.iter().all(|s| s.starts_with("cu")));
    assert!(names.contains(&"cuInit") && names.contains(&"cuLaunchKernel"));
}
