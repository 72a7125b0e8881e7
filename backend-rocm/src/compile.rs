//! Runtime compilation with hiprtc ([`compile`]) and what it produces ([`CodeObject`]).

use crate::error::RocmError;
use crate::ffi::{self, RawProgram};
use std::ffi::CString;

/// Options every compilation gets, from `core/DETERMINISM.md`: no contraction into fused
/// multiply-add, IEEE denormals kept (no flush-to-zero), no fast math.
pub const COMPILE_OPTIONS: &[&str] = &[
    "-O3",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-fno-gpu-flush-denormals-to-zero",
];

/// True if `s` is a plausible AMD target ID (`gfx90a`, `gfx90a:sramecc+:xnack-`): a processor
/// name of ASCII letters and digits, then `:feature±` parts. Anything else is refused before it
/// reaches the compiler's command line.
pub fn valid_target_id(s: &str) -> bool {
    let mut parts = s.split(':');
    let proc_ok = parts
        .next()
        .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric()));
    proc_ok
        && parts.all(|f| {
            f.len() > 1
                && (f.ends_with('+') || f.ends_with('-'))
                && f[..f.len() - 1]
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        })
}

/// A compiled AMD GPU code object (an ELF for `EM_AMDGPU`), as hiprtc returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeObject {
    bytes: Vec<u8>,
}

/// `EM_AMDGPU`, the ELF machine of AMD GPU code objects.
pub const EM_AMDGPU: u16 = 224;

impl CodeObject {
    /// Wraps bytes (for example from `hipcc --genco`, after [`unbundle`]) without checking them.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self { bytes }
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// `Some(e_machine)` if the bytes start as a 64-bit little-endian ELF.
    pub fn elf_machine(&self) -> Option<u16> {
        let b = &self.bytes;
        if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
            return None;
        }
        Some(u16::from_le_bytes([b[18], b[19]]))
    }

    /// The `EF_AMDGPU_MACH` field of the ELF flags (the processor the code is for), if this is an
    /// AMD GPU ELF.
    pub fn amdgpu_mach(&self) -> Option<u32> {
        if self.elf_machine()? != EM_AMDGPU {
            return None;
        }
        let b = &self.bytes;
        Some(u32::from_le_bytes([b[48], b[49], b[50], b[51]]) & 0xff)
    }

    /// The processor name of [`amdgpu_mach`](Self::amdgpu_mach), for the targets this crate
    /// knows (values from LLVM's `ELF.h`).
    pub fn processor(&self) -> Option<&'static str> {
        Some(match self.amdgpu_mach()? {
            0x2c => "gfx900",
            0x2f => "gfx906",
            0x30 => "gfx908",
            0x36 => "gfx1030",
            0x3f => "gfx90a",
            0x40 => "gfx940",
            0x41 => "gfx1100",
            0x4b => "gfx941",
            0x4c => "gfx942",
            _ => return None,
        })
    }
}

/// Splits a clang offload bundle (what `hipcc --genco` writes) into `(target id, bytes)` pairs.
/// Returns `None` if `bytes` is not a well-formed bundle.
pub fn unbundle(bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    const MAGIC: &[u8] = b"__CLANG_OFFLOAD_BUNDLE__";
    let u64_at = |at: usize| -> Option<usize> {
        let s = bytes.get(at..at.checked_add(8)?)?;
        usize::try_from(u64::from_le_bytes(s.try_into().ok()?)).ok()
    };
    if !bytes.starts_with(MAGIC) {
        return None;
    }
    let n = u64_at(MAGIC.len())?;
    let mut at = MAGIC.len() + 8;
    let mut out = Vec::new();
    for _ in 0..n {
        let (off, size, id_len) = (u64_at(at)?, u64_at(at + 8)?, u64_at(at + 16)?);
        at += 24;
        let id = bytes.get(at..at.checked_add(id_len)?)?;
        at += id_len;
        let body = bytes.get(off..off.checked_add(size)?)?;
        out.push((String::from_utf8_lossy(id).into_owned(), body.to_vec()));
    }
    Some(out)
}

/// Owns a hiprtc program and destroys it on every exit path.
struct Program {
    raw: RawProgram,
    rtc: &'static ffi::Rtc,
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `raw` is a live program created by `hiprtcCreateProgram`, destroyed once.
        let _ = unsafe { (self.rtc.api.hiprtcDestroyProgram)(&mut self.raw) };
    }
}

impl Program {
    fn log(&self) -> Result<String, RocmError> {
        let rtc = self.rtc;
        let mut size = 0usize;
        // SAFETY: `raw` is live; `size` is a valid out-pointer.
        rtc.check("hiprtcGetProgramLogSize", unsafe {
            (rtc.api.hiprtcGetProgramLogSize)(self.raw, &mut size)
        })?;
        let mut buf = vec![0u8; size.saturating_add(1)];
        // SAFETY: `buf` holds at least `size` bytes, the size hiprtc reported for the log.
        rtc.check("hiprtcGetProgramLog", unsafe {
            (rtc.api.hiprtcGetProgramLog)(self.raw, buf.as_mut_ptr().cast())
        })?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }
}

pub(crate) fn c_string(s: &str) -> Result<CString, RocmError> {
    CString::new(s).map_err(|_| RocmError::InvalidName { name: s.to_owned() })
}

/// Compiles HIP source with hiprtc for `arch` (an AMD target ID such as `gfx90a`), with
/// [`COMPILE_OPTIONS`] and `extra_options`. With `arch = None` hiprtc targets the calling
/// thread's current device (and fails without one).
///
/// Needs hiprtc but no GPU. Note: ROCm 5.2's hiprtc aborts the process (instead of returning an
/// error) for targets its code-object manager does not know, such as `gfx940`; check a new target
/// with `hipcc --genco` first.
///
/// # Errors
/// [`RocmError::NoHiprtc`] when hiprtc cannot be loaded, [`RocmError::InvalidName`] for a bad
/// target ID or a NUL byte, [`RocmError::Hiprtc`] with the compiler log when compilation fails,
/// [`RocmError::HiprtcCall`] when another hiprtc call fails.
pub fn compile(
    source: &str,
    name: &str,
    arch: Option<&str>,
    extra_options: &[&str],
) -> Result<CodeObject, RocmError> {
    let rtc = ffi::rtc()?;
    // ROCm 5.2's hiprtc crashes (SIGSEGV) when two programs compile at once in one process:
    // compilations are serialised.
    static COMPILING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = COMPILING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let src = c_string(source)?;
    let file = c_string(name)?;
    let mut options: Vec<CString> = Vec::new();
    if let Some(arch) = arch {
        if !valid_target_id(arch) {
            return Err(RocmError::InvalidName {
                name: arch.to_owned(),
            });
        }
        options.push(c_string(&format!("--offload-arch={arch}"))?);
    }
    for o in COMPILE_OPTIONS.iter().chain(extra_options) {
        options.push(c_string(o)?);
    }
    let option_ptrs: Vec<*const core::ffi::c_char> = options.iter().map(|o| o.as_ptr()).collect();
    let n_options = i32::try_from(option_ptrs.len()).map_err(|_| RocmError::TooLarge)?;

    let mut raw: RawProgram = core::ptr::null_mut();
    // SAFETY: `src` and `file` are NUL-terminated and outlive the call; no headers are passed
    // (count 0, null arrays), as the API allows.
    rtc.check("hiprtcCreateProgram", unsafe {
        (rtc.api.hiprtcCreateProgram)(
            &mut raw,
            src.as_ptr(),
            file.as_ptr(),
            0,
            core::ptr::null(),
            core::ptr::null(),
        )
    })?;
    let program = Program { raw, rtc };
    // SAFETY: `program.raw` is live; `option_ptrs` holds `n_options` pointers to NUL-terminated
    // strings owned by `options`, which outlives the call.
    let status =
        unsafe { (rtc.api.hiprtcCompileProgram)(program.raw, n_options, option_ptrs.as_ptr()) };
    if status != ffi::SUCCESS {
        let log = program.log().unwrap_or_default();
        if status == ffi::HIPRTC_ERROR_COMPILATION || !log.is_empty() {
            return Err(RocmError::Hiprtc { log });
        }
        rtc.check("hiprtcCompileProgram", status)?;
    }
    let mut size = 0usize;
    // SAFETY: `program.raw` is live and compiled; `size` is a valid out-pointer.
    rtc.check("hiprtcGetCodeSize", unsafe {
        (rtc.api.hiprtcGetCodeSize)(program.raw, &mut size)
    })?;
    let mut bytes = vec![0u8; size];
    // SAFETY: `bytes` holds exactly the `size` bytes hiprtc reported for the code.
    rtc.check("hiprtcGetCode", unsafe {
        (rtc.api.hiprtcGetCode)(program.raw, bytes.as_mut_ptr().cast())
    })?;
    Ok(CodeObject { bytes })
}

/// hiprtc's version, `(major, minor)`.
///
/// # Errors
/// [`RocmError::NoHiprtc`] when hiprtc cannot be loaded.
pub fn hiprtc_version() -> Result<(i32, i32), RocmError> {
    let rtc = ffi::rtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both are valid, writable `int`s.
    rtc.check("hiprtcVersion", unsafe {
        (rtc.api.hiprtcVersion)(&mut major, &mut minor)
    })?;
    Ok((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_ids_are_checked() {
        for ok in [
            "gfx90a",
            "gfx90a:sramecc+:xnack-",
            "gfx1100",
            "gfx942:xnack+",
        ] {
            assert!(valid_target_id(ok), "{ok}");
        }
        for bad in [
            "",
            "gfx90a ",
            "gfx90a:xnack",
            "gfx90a:+",
            "-O0",
            "gfx90a;rm",
        ] {
            assert!(!valid_target_id(bad), "{bad}");
        }
    }

    #[test]
    fn bundles_are_parsed_and_malformed_ones_refused() {
        let mut b = b"__CLANG_OFFLOAD_BUNDLE__".to_vec();
        b.extend(1u64.to_le_bytes());
        let id = b"hipv4-amdgcn-amd-amdhsa--gfx90a";
        let off = b.len() + 24 + id.len();
        b.extend((off as u64).to_le_bytes());
        b.extend(3u64.to_le_bytes());
        b.extend((id.len() as u64).to_le_bytes());
        b.extend(id);
        b.extend(b"abc");
        let entries = unbundle(&b).unwrap();
        assert_eq!(
            entries,
            vec![(String::from_utf8(id.to_vec()).unwrap(), b"abc".to_vec())]
        );
        assert_eq!(unbundle(&b[..b.len() - 1]), None);
        assert_eq!(unbundle(b"\x7fELF"), None);
    }

    #[test]
    fn elf_header_fields_are_decoded() {
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[18..20].copy_from_slice(&EM_AMDGPU.to_le_bytes());
        elf[48..52].copy_from_slice(&0x053fu32.to_le_bytes());
        let code = CodeObject::from_bytes(elf.clone());
        assert_eq!(code.amdgpu_mach(), Some(0x3f));
        assert_eq!(code.processor(), Some("gfx90a"));
        elf[18] = 62; // EM_X86_64
        assert_eq!(CodeObject::from_bytes(elf).processor(), None);
        assert_eq!(CodeObject::from_bytes(vec![0; 10]).elf_machine(), None);
    }
}
