//! The single-source kernel compiles for AMD targets, without a GPU: in process with hiprtc (the
//! path the backend uses at run time) and with `hipcc --genco` for the newest target the installed
//! toolchain knows. Each test reports SKIPPED when its tool is absent (and fails under
//! `CI=true`, where `scripts/test.sh` has installed the tools with `scripts/rocm-tools.sh`).

use specula_core::gpu::ENTRY_NAMES;
use specula_core::gpu::kernels::{SOURCE, VERIFY_ENTRY};
use specula_rocm::{COMPILE_OPTIONS, CodeObject, EM_AMDGPU, RocmError, compile, unbundle};
use specula_tests::skip::skipped;
use std::process::Command;

fn hiprtc_available(test: &str) -> bool {
    match specula_rocm::hiprtc_version() {
        Ok(_) => true,
        Err(RocmError::NoHiprtc { reason }) => {
            skipped(
                "specula-rocm",
                test,
                &format!("hiprtc not available ({reason}); run scripts/rocm-tools.sh"),
            );
            false
        }
        Err(e) => panic!("hiprtc_version: {e:?}"),
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn hiprtc_compiles_the_kernel_for_gfx90a() {
    if !hiprtc_available("hiprtc_compiles_the_kernel_for_gfx90a") {
        return;
    }
    let code = compile(
        SOURCE,
        "specula_verify.cu",
        Some("gfx90a"),
        &["-DSPECULA_HIP=1"],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(code.elf_machine(), Some(EM_AMDGPU));
    assert_eq!(code.processor(), Some("gfx90a"));
    // Every chain entry `RocmDriver` loads (plain and split, each also `_logits` with the
    // softmax computed on the fly) is in the same code object.
    for entry in ENTRY_NAMES {
        assert!(
            contains(code.as_bytes(), entry.as_bytes()),
            "{entry} missing"
        );
    }
    // Same text, same options: same bytes (the per-device cache relies on nothing else).
    let again = compile(
        SOURCE,
        "specula_verify.cu",
        Some("gfx90a"),
        &["-DSPECULA_HIP=1"],
    );
    assert_eq!(
        again.as_ref().map(CodeObject::processor),
        Ok(Some("gfx90a"))
    );
}

/// The tree kernel text (`TREE_SOURCE`: the chain text, then `core/kernels/specula_tree.cu`)
/// compiles with hiprtc for gfx90a in HIP mode and holds both tree entries
/// (`specula_verify_tree`, `specula_verify_tree_half`).
#[test]
fn hiprtc_compiles_the_tree_kernel_for_gfx90a() {
    if !hiprtc_available("hiprtc_compiles_the_tree_kernel_for_gfx90a") {
        return;
    }
    let code = compile(
        specula_core::gpu::kernels::TREE_SOURCE,
        "specula_tree.cu",
        Some("gfx90a"),
        &["-DSPECULA_HIP=1"],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(code.elf_machine(), Some(EM_AMDGPU));
    assert_eq!(code.processor(), Some("gfx90a"));
    for entry in specula_core::gpu::kernels::TREE_ENTRY_NAMES {
        // The symbol name as the string table holds it, NUL-terminated (one is a prefix of the
        // other).
        let name = format!("{entry}\0");
        assert!(contains(code.as_bytes(), name.as_bytes()), "{entry}");
    }
}

#[test]
fn hiprtc_errors_are_typed_and_carry_the_log() {
    if !hiprtc_available("hiprtc_errors_are_typed_and_carry_the_log") {
        return;
    }
    let bad = "extern \"C\" __global__ void broken(float* x) { x[0] = undeclared_name; }";
    match compile(bad, "broken.cu", Some("gfx90a"), &[]) {
        Err(RocmError::Hiprtc { log }) => assert!(log.contains("undeclared_name"), "{log}"),
        other => panic!("expected a compile error with its log, got {other:?}"),
    }
    // Target IDs are checked before they reach the compiler's command line.
    for arch in ["gfx90a --save-temps", "", "gfx90a:xnack", "gfx\0"] {
        assert!(
            matches!(
                compile(SOURCE, "k.cu", Some(arch), &[]),
                Err(RocmError::InvalidName { .. })
            ),
            "{arch:?} accepted"
        );
    }
}

/// `hipcc --genco` for `arch` on the kernel text; `Ok(None)` when the toolchain rejects the
/// target, `Err` when hipcc is missing.
fn genco(arch: &str) -> Result<Option<Vec<u8>>, String> {
    let dir = std::env::temp_dir().join(format!("specula-rocm-{}-{arch}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let src = dir.join("specula_verify.hip");
    let out = dir.join("specula_verify.co");
    // hiprtc includes the HIP runtime header implicitly; hipcc needs it spelled out.
    let text = format!("#include <hip/hip_runtime.h>\n{SOURCE}");
    std::fs::write(&src, text).map_err(|e| e.to_string())?;
    let run = Command::new("hipcc")
        .arg("--genco")
        .arg(format!("--offload-arch={arch}"))
        .args(COMPILE_OPTIONS)
        .arg("-DSPECULA_HIP=1")
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .output()
        .map_err(|e| format!("hipcc: {e}"))?;
    let result = if run.status.success() {
        Some(std::fs::read(&out).map_err(|e| e.to_string())?)
    } else {
        eprintln!(
            "hipcc rejected {arch}: {}",
            String::from_utf8_lossy(&run.stderr)
                .lines()
                .next()
                .unwrap_or("")
        );
        None
    };
    let _ = std::fs::remove_dir_all(&dir);
    Ok(result)
}

/// The AMD GPU code object for `arch` inside a `hipcc --genco` bundle.
fn device_code(bundle: &[u8], arch: &str) -> CodeObject {
    let entries = unbundle(bundle).expect("hipcc --genco output is a clang offload bundle");
    let (id, body) = entries
        .into_iter()
        .find(|(id, _)| id.starts_with("hip") && id.contains("amdgcn"))
        .expect("bundle has an amdgcn entry");
    assert!(id.ends_with(arch), "bundle entry {id} is not for {arch}");
    CodeObject::from_bytes(body)
}

/// `genco(arch)`, or `None` after reporting the test SKIPPED when hipcc is missing.
fn genco_or_skip(test: &str, arch: &str) -> Option<Option<Vec<u8>>> {
    match genco(arch) {
        Err(e) => {
            skipped(
                "specula-rocm",
                test,
                &format!("{e}; run scripts/rocm-tools.sh"),
            );
            None
        }
        Ok(bytes) => Some(bytes),
    }
}

// Two tests, not one: each compile is minutes of single-threaded hipcc, and the test runner
// runs them side by side.
#[test]
fn hipcc_compiles_the_kernel_for_gfx90a() {
    let Some(gfx90a) = genco_or_skip("hipcc_compiles_the_kernel_for_gfx90a", "gfx90a") else {
        return;
    };
    let gfx90a = gfx90a.expect("hipcc must accept gfx90a");
    let code = device_code(&gfx90a, "gfx90a");
    assert_eq!(code.processor(), Some("gfx90a"));
    assert!(contains(code.as_bytes(), VERIFY_ENTRY.as_bytes()));
}

#[test]
fn hipcc_compiles_the_kernel_for_the_newest_mi_target() {
    const TEST: &str = "hipcc_compiles_the_kernel_for_the_newest_mi_target";
    // Newest first: MI300 (gfx942), its earlier steppings, then MI300's first target ID, gfx940,
    // which is the newest ROCm 5.2's clang 15 accepts.
    let mut newest = None;
    for arch in ["gfx942", "gfx941", "gfx940"] {
        let Some(bytes) = genco_or_skip(TEST, arch) else {
            return;
        };
        if let Some(bytes) = bytes {
            newest = Some((arch, bytes));
            break;
        }
    }
    let (arch, bytes) = newest.expect("hipcc accepts none of gfx942, gfx941, gfx940");
    eprintln!("newest MI-series target accepted by hipcc: {arch}");
    let code = device_code(&bytes, arch);
    assert_eq!(code.elf_machine(), Some(EM_AMDGPU));
    assert_eq!(code.processor(), Some(arch));
    assert!(contains(code.as_bytes(), VERIFY_ENTRY.as_bytes()));
}
