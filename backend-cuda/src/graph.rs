//! [`VerifyGraph`]: the verification launch captured once in a CUDA graph and replayed.
//!
//! Runtimes that capture their decode step in a CUDA graph can simply call
//! [`CudaVerifier::launch`] while their own stream is being captured (it makes no call that
//! capture forbids). This type is for the case where Specula owns the stream: it captures the
//! launch on the device's compute stream and replays it with one `cuGraphLaunch`. Because the
//! kernel reads every per-call value (batch size, `k`, seeds, offsets, shape, method) from the
//! device buffers named in [`DeviceArgs`], a replay sees whatever those buffers hold when it
//! runs; only the pointers and the block count are frozen.

use crate::calls::{Blocking, call};
use crate::device::{CudaDevice, DeviceBuffer};
use crate::error::CudaError;
use crate::verifier::{CudaVerifier, DeviceArgs};
use cudarc::driver::result;
use cudarc::driver::sys::{CUgraph, CUgraphExec, CUgraphInstantiate_flags, CUstreamCaptureMode};
use std::sync::Arc;

/// One captured verification launch, ready to replay on the compute stream.
#[derive(Debug)]
pub struct VerifyGraph {
    dev: Arc<CudaDevice>,
    // The counters the captured kernel updates and the split entry's scratch; kept alive as
    // long as the graph is.
    _stats: Arc<DeviceBuffer>,
    _scratch: Option<Arc<DeviceBuffer>>,
    graph: CUgraph,
    exec: CUgraphExec,
    args: DeviceArgs,
}

// SAFETY: the graph handles are owned by this value and only used through it; CUDA graphs may
// be launched from any thread once the context is current (every method binds it).
unsafe impl Send for VerifyGraph {}

impl<const K: usize> CudaVerifier<K> {
    /// Captures one [`launch`](CudaVerifier::launch) on `args` into a CUDA graph (stream capture
    /// in thread-local mode on the compute stream) and instantiates it. Set-up, not the step
    /// path: instantiation may block. A stream that cannot be captured (the legacy default
    /// stream, given to [`CudaDevice::with_stream`](crate::CudaDevice::with_stream)) gives the
    /// driver's error as [`CudaError::Driver`].
    ///
    /// # Safety
    /// As for [`launch`](CudaVerifier::launch), and the buffers must stay valid for as long as
    /// the graph is replayed (see [`VerifyGraph::replay`]).
    pub unsafe fn capture(&mut self, args: &DeviceArgs) -> Result<VerifyGraph, CudaError> {
        self.device().bind()?;
        let stream = self.device().cu_stream();
        // SAFETY: a live stream of the current context.
        call("cuStreamBeginCapture", Blocking::No, || unsafe {
            result::stream::begin_capture(
                stream,
                CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        })?;
        // SAFETY: the caller's contract covers the pointers; during capture the launch is
        // recorded, not run.
        let launched = unsafe { self.launch(args) };
        // Always end the capture, so a failed launch leaves the stream usable.
        // SAFETY: the stream is capturing (begun above).
        let ended = call("cuStreamEndCapture", Blocking::No, || unsafe {
            result::stream::end_capture(stream)
        });
        let graph = match (launched, ended) {
            (Ok(()), Ok(g)) => g,
            (Err(e), Ok(g)) => {
                // SAFETY: `g` was just returned by end_capture and is destroyed once, here.
                let _ = unsafe { result::graph::destroy(g) };
                return Err(e);
            }
            (_, Err(e)) => return Err(e),
        };
        // SAFETY: `graph` is the live graph captured above.
        let exec = match call("cuGraphInstantiateWithFlags", Blocking::Yes, || unsafe {
            result::graph::instantiate(graph, CUgraphInstantiate_flags(0))
        }) {
            Ok(x) => x,
            Err(e) => {
                // SAFETY: as above; not yet owned by a `VerifyGraph`.
                let _ = unsafe { result::graph::destroy(graph) };
                return Err(e);
            }
        };
        Ok(VerifyGraph {
            dev: self.device().clone(),
            _stats: self.stats_buffer(),
            _scratch: self.split_buffer(),
            graph,
            exec,
            args: *args,
        })
    }
}

impl VerifyGraph {
    /// The arguments the graph was captured with (the buffers it reads and writes).
    #[must_use]
    pub fn args(&self) -> &DeviceArgs {
        &self.args
    }

    /// The step path with a graph: one `cuGraphLaunch` on the compute stream (plus making the
    /// context current), never synchronising. The kernel reads the values the buffers in
    /// [`args`](VerifyGraph::args) hold when it runs, so write the next step's inputs (stream
    /// ordered, or before the replay is enqueued) and replay.
    ///
    /// # Safety
    /// Every buffer in [`args`](VerifyGraph::args) must still be valid device memory of the
    /// size the shape words it holds at run time imply (at most `capacity` requests).
    pub unsafe fn replay(&self) -> Result<(), CudaError> {
        self.dev.bind()?;
        let stream = self.dev.cu_stream();
        // SAFETY: a live executable graph and stream of the current context; the caller vouches
        // for the buffers the captured kernel touches.
        call("cuGraphLaunch", Blocking::No, || unsafe {
            result::graph::launch(self.exec, stream)
        })
    }
}

impl Drop for VerifyGraph {
    fn drop(&mut self) {
        if self.dev.bind().is_ok() {
            // SAFETY: created in `capture` and destroyed once, here. Destroying an executable
            // graph with launches still pending is allowed: they complete first.
            unsafe {
                let _ = result::graph::exec_destroy(self.exec);
                let _ = result::graph::destroy(self.graph);
            }
        }
    }
}
