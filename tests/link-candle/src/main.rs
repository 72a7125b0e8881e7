//! Uses both crates, as a candle-based runtime with Specula's CUDA backend would.

#[cfg(feature = "major-16")]
use cudarc_016 as cudarc;
#[cfg(all(feature = "major-19", not(feature = "major-16")))]
use cudarc_019 as cudarc;

use cudarc::driver::CudaSlice;
use specula::cuda::CudaDriver;

/// The application's own cudarc rows, borrowed by Specula: this compiles only where Specula's
/// cudarc major is the application's.
fn rows_of(drv: &CudaDriver, logits: &CudaSlice<f32>, vocab: usize) -> usize {
    let rows = drv.borrow_rows(logits);
    let _ = rows.rows(vocab);
    vocab
}

fn main() {
    let devices = if specula::cuda::driver_present() {
        cudarc::driver::CudaContext::device_count().unwrap_or(0)
    } else {
        0
    };
    let backend = "cuda".parse::<specula::BackendSpec>().map(|s| s.kind);
    let borrow: fn(&CudaDriver, &CudaSlice<f32>, usize) -> usize = rows_of;
    println!("{devices} CUDA devices; backend {backend:?}; borrow_rows at {borrow:p}");
}
