//! The toolchain tier of `specula-rocm`: the kernel text compiled by hiprtc and by hipcc
//! (`scripts/rocm-tools.sh` installs them), minutes of single-threaded compiler time per target.
//! A binary of its own so that the fast tier can leave it out by name (`binary(toolchain)` in
//! .config/nextest.toml).

mod compile_kernel;
