//! Uses both crates, as a candle-based runtime with Specula's CUDA backend would.

fn main() {
    let devices = if specula::cuda::driver_present() {
        cudarc::driver::CudaContext::device_count().unwrap_or(0)
    } else {
        0
    };
    let backend = "cuda".parse::<specula::BackendSpec>().map(|s| s.kind);
    println!("{devices} CUDA devices; backend {backend:?}");
}
