//! The toolchain tier of `specula-cuda`: the kernel text compiled by NVRTC and assembled by
//! ptxas (`scripts/cuda-tools.sh` installs both), minutes of single-threaded compiler time per
//! architecture. A binary of its own so that the fast tier can leave it out by name
//! (`binary(toolchain)` in .config/nextest.toml) and `scripts/test.sh` can run it again with
//! NVRTC 13.

mod nvrtc;
