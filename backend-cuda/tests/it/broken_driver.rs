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

const PARTIAL: &str = "SPECULA_PARTIAL_DRIVER_CHILD";

/// A `libcuda` that exports exactly [`specula_cuda::DRIVER_SYMBOLS`] (each a stub returning
/// `CUDA_ERROR_NO_DEVICE`) and nothing else of the driver API: what a driver older than the
/// bindings looks like to cudarc. cudarc before 0.19.5 (0.16 to 0.18) loads its whole API on
/// the first call and panics on the first function missing; later releases load what is
/// called. Either way the answer is a typed error, never a panic: `NoDriver` where cudarc's
/// loader refuses the library, `NoDevice` where the stubs answer.
#[test]
fn a_driver_with_only_the_crates_symbols_is_a_typed_error() {
    if std::env::var_os(PARTIAL).is_some() {
        let present = specula_cuda::driver_present();
        let got = CudaDevice::new(0).map(|_| ());
        println!("driver_present {present}, CudaDevice::new {got:?}");
        match got {
            Err(CudaError::NoDriver) => assert!(!present),
            Err(CudaError::NoDevice) => assert!(present),
            other => panic!("expected NoDriver or NoDevice, got {other:?}"),
        }
        return;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let dir = std::env::temp_dir().join(format!("specula-partial-libcuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let stubs: String = specula_cuda::DRIVER_SYMBOLS
        .iter()
        .map(|name| format!("int {name}(void) {{ return 100; }}\n"))
        .collect();
    std::fs::write(dir.join("stub.c"), stubs).unwrap();
    let built = Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join("libcuda.so"))
        .arg(dir.join("stub.c"))
        .status()
        .is_ok_and(|s| s.success());
    if !built {
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!("SKIPPED: no C compiler ({cc}) to build a partial libcuda");
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: C compiler missing"
        );
        return;
    }
    std::fs::copy(dir.join("libcuda.so"), dir.join("libcuda.so.1")).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "broken_driver::a_driver_with_only_the_crates_symbols_is_a_typed_error",
            "--nocapture",
        ])
        .env(PARTIAL, "1")
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
    let seen = text.lines().find(|l| l.starts_with("driver_present"));
    println!("partial libcuda: {}", seen.unwrap_or("?"));
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
