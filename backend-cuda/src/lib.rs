#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod compile;
mod device;
mod driver;
mod error;
mod ffi;
mod memory;
mod readback;

pub use compile::{
    compile_ptx, compile_source_ptx, compile_tree_ptx, nvrtc_options, nvrtc_present, nvrtc_version,
};
/// The `cudarc` crate whose tensors [`CudaDriver::borrow_rows`] and [`CudaDriver::borrow_mut`]
/// take, re-exported so that an engine names the same version.
pub use cudarc;
pub use device::{CudaDevice, CudaEvent};
pub use driver::{
    CudaDriver, CudaForeign, CudaForeignMut, CudaGraph, CudaRows, CudaVerifier, RowElement,
};
pub use error::CudaError;
pub use ffi::{CallCounts, DRIVER_SYMBOLS, NVRTC_ENV, call_counts, driver_present};
pub use memory::{CudaDeviceBuffer, CudaPinnedBuffer};
pub use readback::CudaReadback;
