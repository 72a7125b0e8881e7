#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// One cudarc major, the engine's (Cargo.toml, `cudarc-0-NN`), named `cudarc` for every module
// and re-exported. With two on, the newest is named (so the one error is the one below).
#[cfg(not(any(
    feature = "cudarc-0-16",
    feature = "cudarc-0-17",
    feature = "cudarc-0-18",
    feature = "cudarc-0-19"
)))]
compile_error!(
    "specula-cuda: turn on one cudarc major feature (cudarc-0-16, cudarc-0-17, cudarc-0-18 or \
     cudarc-0-19), the one the engine's cudarc is; the default is cudarc-0-19"
);
#[cfg(any(
    all(feature = "cudarc-0-16", feature = "cudarc-0-17"),
    all(feature = "cudarc-0-16", feature = "cudarc-0-18"),
    all(feature = "cudarc-0-16", feature = "cudarc-0-19"),
    all(feature = "cudarc-0-17", feature = "cudarc-0-18"),
    all(feature = "cudarc-0-17", feature = "cudarc-0-19"),
    all(feature = "cudarc-0-18", feature = "cudarc-0-19")
))]
compile_error!(
    "specula-cuda: two cudarc major features are on; exactly one may be (an older one needs \
     `default-features = false`, which drops the default cudarc-0-19)"
);

#[cfg(all(
    feature = "cudarc-0-16",
    not(any(
        feature = "cudarc-0-17",
        feature = "cudarc-0-18",
        feature = "cudarc-0-19"
    ))
))]
/// The `cudarc` crate whose tensors [`CudaDriver::borrow_rows`] and [`CudaDriver::borrow_mut`]
/// take (see the `cudarc-0-NN` features).
pub extern crate cudarc_016 as cudarc;
#[cfg(all(
    feature = "cudarc-0-17",
    not(any(feature = "cudarc-0-18", feature = "cudarc-0-19"))
))]
/// The `cudarc` crate whose tensors [`CudaDriver::borrow_rows`] and [`CudaDriver::borrow_mut`]
/// take (see the `cudarc-0-NN` features).
pub extern crate cudarc_017 as cudarc;
#[cfg(all(feature = "cudarc-0-18", not(feature = "cudarc-0-19")))]
/// The `cudarc` crate whose tensors [`CudaDriver::borrow_rows`] and [`CudaDriver::borrow_mut`]
/// take (see the `cudarc-0-NN` features).
pub extern crate cudarc_018 as cudarc;
/// The `cudarc` crate whose tensors [`CudaDriver::borrow_rows`] and [`CudaDriver::borrow_mut`]
/// take, re-exported so that an engine names the same version: the major its `cudarc-0-NN`
/// feature picks.
#[cfg(feature = "cudarc-0-19")]
pub extern crate cudarc_019 as cudarc;

mod compile;
mod device;
mod driver;
mod error;
mod ffi;
mod memory;

pub use compile::{
    compile_ptx, compile_source_ptx, compile_tree_ptx, nvrtc_options, nvrtc_present, nvrtc_version,
};
pub use device::{CudaDevice, CudaEvent};
pub use driver::{
    CudaDriver, CudaForeign, CudaForeignMut, CudaGraph, CudaReadback, CudaRows, CudaVerifier,
    RowElement,
};
pub use error::CudaError;
pub use ffi::{CallCounts, DRIVER_SYMBOLS, NVRTC_ENV, call_counts, driver_present};
pub use memory::{CudaDeviceBuffer, CudaPinnedBuffer};
