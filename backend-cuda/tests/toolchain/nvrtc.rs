//! The kernel text compiles with NVRTC for compute_80 and compute_90 and the PTX assembles with
//! `ptxas` for sm_80 and sm_90. No GPU needed: only libnvrtc and ptxas, which
//! `scripts/cuda-tools.sh` installs (pip wheels) into `.tools/cuda`. Skipped, with a message,
//! when they are absent; CI runs it for real after the script.

use std::path::PathBuf;
use std::process::Command;

/// FNV-1a, 64 bits: the kernel cache's key (scripts/kernel-report.py computes the same).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SPECULA_PTXAS") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("ptxas"))
        .find(|p| p.is_file())
}

// One test per architecture: each compile is a minute or more of single-threaded NVRTC and
// ptxas, and the test runner runs the tests side by side.
#[test]
fn kernel_compiles_and_assembles_for_ampere() {
    chain_kernel("compute_80", "sm_80");
}

#[test]
fn kernel_compiles_and_assembles_for_hopper() {
    chain_kernel("compute_90", "sm_90");
}

/// The chain kernel text compiles for `arch` with the crate's options, has every entry point,
/// no contraction or fast-math instruction outside the series division, and assembles for `sm`.
fn chain_kernel(arch: &str, sm: &str) {
    if !specula_cuda::nvrtc_present() {
        assert!(
            std::env::var_os("SPECULA_EXPECT_NVRTC_MAJOR").is_none(),
            "SPECULA_EXPECT_NVRTC_MAJOR is set but no NVRTC loaded"
        );
        println!("SKIPPED: libnvrtc not found (run `. scripts/cuda-tools.sh` first)");
        return;
    }
    let ptxas = ptxas();
    if ptxas.is_none() {
        println!("SKIPPED (assembly only): ptxas not found; NVRTC compilation still checked");
    }
    let version = specula_cuda::nvrtc_version();
    println!("NVRTC version {version:?}");
    // scripts/test.sh runs this test once per NVRTC major version it installed.
    if let Some(major) = std::env::var_os("SPECULA_EXPECT_NVRTC_MAJOR") {
        let major: i32 = major
            .to_str()
            .and_then(|m| m.parse().ok())
            .expect("a number");
        assert_eq!(version.map(|v| v.0), Some(major), "the NVRTC that loaded");
    }
    // SPECULA_KERNEL_CACHE (scripts/test.sh sets it): keep the PTX, the cubin and ptxas's
    // report there, so that scripts/kernel-report.py reads this compile of the kernel instead
    // of compiling it again.
    let cache = std::env::var_os("SPECULA_KERNEL_CACHE").map(PathBuf::from);
    let dir = cache.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("specula-nvrtc-{sm}-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir).unwrap();
    let ptx = specula_cuda::compile_ptx(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
    assert!(
        ptx.contains(".entry specula_verify"),
        "{arch}: entry point missing"
    );
    for entry in [
        specula_core::gpu::kernels::VERIFY_SPLIT_ENTRY,
        specula_core::gpu::kernels::VERIFY_LOGITS_ENTRY,
        specula_core::gpu::kernels::VERIFY_SPLIT_LOGITS_ENTRY,
    ] {
        assert!(
            ptx.contains(&format!(".entry {entry}(")),
            "{arch}: entry point {entry} missing"
        );
    }
    // --fmad=false: the compiler may not fuse a multiply and an add. The kernel asks for
    // FMAs (and one .ftz reciprocal) only inside its exact division of ln_p's series
    // (sp_div_series, one inline-asm block) and in sp_fma (an inline-asm block of one
    // fma.rn.f32, each use argued in the kernel text), so any other fma instruction in the PTX
    // would be a contraction that breaks bit-exactness.
    let (compiled, asm_blocks) = split_inline_asm(&ptx);
    assert!(
        !compiled.contains("fma.rn.f32"),
        "{arch}: contracted multiply-add in the PTX"
    );
    // No approximate (fast-math) division or flush-to-zero arithmetic either.
    assert!(
        !compiled.contains("div.approx"),
        "{arch}: approximate division"
    );
    assert!(
        !compiled.contains(".ftz.f32"),
        "{arch}: flush-to-zero arithmetic"
    );
    let with_fma: Vec<&String> = asm_blocks
        .iter()
        .filter(|b| b.contains("fma") || b.contains("ftz") || b.contains("rcp"))
        .collect();
    assert!(
        !with_fma.is_empty(),
        "{arch}: the series division is missing"
    );
    for block in with_fma {
        let ops: Vec<&str> = block
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|w| w.contains('.') && !w.starts_with(".reg"))
            .collect();
        if ops == ["fma.rn.f32"] {
            continue; // sp_fma
        }
        assert_eq!(
            ops,
            [
                "rcp.approx.ftz.f32",
                "neg.f32",
                "fma.rn.f32",
                "fma.rn.f32",
                "mul.rn.f32",
                "neg.f32",
                "fma.rn.f32",
                "fma.rn.f32"
            ],
            "{arch}: an inline-asm block with FMAs that is neither the series division nor sp_fma"
        );
    }
    if let Some(ptxas) = &ptxas {
        let src = dir.join(format!("{sm}.ptx"));
        std::fs::write(&src, &ptx).unwrap();
        let out = Command::new(ptxas)
            .arg(format!("-arch={sm}"))
            .arg("-v")
            .arg(&src)
            .arg("-o")
            .arg(dir.join(format!("{sm}.cubin")))
            .output()
            .expect("ptxas runs");
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "ptxas {sm} failed:\n{log}");
        // Register spills would make the kernel much slower; report them loudly.
        println!("ptxas {sm}: {}", log.trim().replace('\n', " | "));
        if cache.is_some() {
            std::fs::write(dir.join(format!("{sm}.ptxas-log")), log.as_bytes()).unwrap();
            // What the report checks before it trusts the log: the kernel text it was
            // compiled from and the ptxas that assembled it.
            let key = format!(
                "fnv1a64={:016x} ptxas={}\n",
                fnv1a64(specula_core::gpu::kernels::SOURCE.as_bytes()),
                ptxas.display()
            );
            std::fs::write(dir.join(format!("{sm}.key")), key).unwrap();
        }
    }
    if cache.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The tree kernel text (`specula_core::gpu::kernels::TREE_SOURCE`: the chain text, then
/// `core/kernels/specula_tree.cu`) compiles with the kernel's NVRTC options for compute_80 and
/// compute_90, has both tree entries (`specula_verify_tree`, `specula_verify_tree_half`), the
/// binary32 one calling its own binary32 row passes only (`sp_tree_*_f32`: no any-format pass
/// and not the half instance, whose call forced the call ABI, and spills, on its row loops), no
/// contracted multiply-add or fast-math instruction outside the series division's inline asm,
/// and assembles with ptxas.
#[test]
fn tree_kernel_compiles_and_assembles_for_ampere() {
    tree_kernel("compute_80", "sm_80");
}

#[test]
fn tree_kernel_compiles_and_assembles_for_hopper() {
    tree_kernel("compute_90", "sm_90");
}

fn tree_kernel(arch: &str, sm: &str) {
    if !specula_cuda::nvrtc_present() {
        println!("SKIPPED: libnvrtc not found (run `. scripts/cuda-tools.sh` first)");
        return;
    }
    let ptxas = ptxas();
    if ptxas.is_none() {
        println!("SKIPPED (assembly only): ptxas not found; NVRTC compilation still checked");
    }
    let dir = std::env::temp_dir().join(format!("specula-nvrtc-tree-{sm}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ptx = specula_cuda::compile_source_ptx(
        specula_core::gpu::kernels::TREE_SOURCE,
        "specula_tree.cu",
        arch,
    )
    .unwrap_or_else(|e| panic!("{arch}: {e}"));
    for entry in specula_core::gpu::kernels::TREE_ENTRY_NAMES {
        assert!(
            ptx.contains(&format!(".entry {entry}(")),
            "{arch}: entry point {entry} missing"
        );
    }
    let entry = specula_core::gpu::kernels::TREE_ENTRY;
    // The binary32 entry's body: from its `.entry` line to the next function.
    let body = ptx.split(&format!(".entry {entry}(")).nth(1).unwrap();
    let body = body.split("\n.func").next().unwrap();
    let body = body.split("\n.visible .entry").next().unwrap();
    // The functions it calls, by their mangled names (`_Z<length><name><parameters>`; its
    // shared arrays are `_ZZ...`, names local to a function).
    let callees: Vec<&str> = body
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.len() > 2 && w.starts_with("_Z") && w.as_bytes()[2].is_ascii_digit())
        .collect();
    assert!(
        !callees.is_empty(),
        "{arch}: {entry} calls none of its row passes"
    );
    for callee in callees {
        let name = callee[2..].trim_start_matches(|c: char| c.is_ascii_digit());
        assert!(
            name.starts_with("sp_tree_") && name.contains("_f32"),
            "{arch}: {entry} calls {callee}, not one of its binary32 passes"
        );
    }
    let (compiled, _) = split_inline_asm(&ptx);
    for bad in ["fma.rn.f32", "fma.rn.f64", "div.approx", ".ftz.f32"] {
        assert!(!compiled.contains(bad), "{arch}: {bad} in the tree PTX");
    }
    if let Some(ptxas) = &ptxas {
        let src = dir.join(format!("tree-{sm}.ptx"));
        std::fs::write(&src, &ptx).unwrap();
        let out = Command::new(ptxas)
            .arg(format!("-arch={sm}"))
            .arg("-v")
            .arg(&src)
            .arg("-o")
            .arg(dir.join(format!("tree-{sm}.cubin")))
            .output()
            .expect("ptxas runs");
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "ptxas {sm} failed:\n{log}");
        let tree_line = log
            .lines()
            .skip_while(|l| !l.contains(&format!("'{entry}'")))
            .take(3)
            .collect::<Vec<_>>()
            .join(" | ");
        println!("ptxas {sm} {entry}: {tree_line}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The NVRTC that loaded is the major version scripts/test.sh expects
/// (`SPECULA_EXPECT_NVRTC_MAJOR`): the library-discovery run (NVRTC found only through
/// `$CUDA_HOME/lib64`) runs this test alone, without compiling the kernel again.
#[test]
fn nvrtc_loads_the_expected_major() {
    let Some(major) = std::env::var_os("SPECULA_EXPECT_NVRTC_MAJOR") else {
        println!("SKIPPED: SPECULA_EXPECT_NVRTC_MAJOR not set (scripts/test.sh sets it)");
        return;
    };
    let major: i32 = major
        .to_str()
        .and_then(|m| m.parse().ok())
        .expect("a number");
    assert!(
        specula_cuda::nvrtc_present(),
        "SPECULA_EXPECT_NVRTC_MAJOR is set but no NVRTC loaded"
    );
    assert_eq!(
        specula_cuda::nvrtc_version().map(|v| v.0),
        Some(major),
        "the NVRTC that loaded"
    );
    // And it compiles (a refusal with its log is enough: the kernel itself is compiled by the
    // other runs).
    assert!(matches!(
        specula_cuda::compile_ptx("compute_1"),
        Err(specula_cuda::CudaError::Nvrtc { .. })
    ));
}

#[test]
fn compile_errors_are_values_not_panics() {
    // Whatever this machine has, compiling for an architecture NVRTC does not know must return
    // an error (NoNvrtc without the library, Nvrtc { log } with it), never panic.
    let r = specula_cuda::compile_ptx("compute_1");
    match r {
        Err(specula_cuda::CudaError::NoNvrtc) => assert!(!specula_cuda::nvrtc_present()),
        Err(specula_cuda::CudaError::Nvrtc { log }) => println!("NVRTC refused as expected: {log}"),
        other => panic!("unexpected: {other:?}"),
    }
}

/// The PTX without its inline-asm blocks (NVRTC marks them `// begin inline asm` ... `// end
/// inline asm`), and the blocks themselves.
fn split_inline_asm(ptx: &str) -> (String, Vec<String>) {
    let mut compiled = String::new();
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in ptx.lines() {
        if line.contains("// begin inline asm") {
            current = Some(String::new());
        } else if line.contains("// end inline asm") {
            blocks.extend(current.take());
        } else if let Some(b) = current.as_mut() {
            b.push_str(line);
            b.push('\n');
        } else {
            compiled.push_str(line);
            compiled.push('\n');
        }
    }
    (compiled, blocks)
}
