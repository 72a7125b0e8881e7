//! [`HostDriver`]: a [`Driver`] that runs the kernel text on the host, with real asynchrony, so
//! CI executes the shared GPU orchestration (`specula_core::gpu`) end to end.
//!
//! * Each stream is a worker thread draining a queue of operations in order; enqueueing never
//!   waits for the worker.
//! * An event is a completion flag with a generation count: `record` enqueues an operation that
//!   raises it, `query` reads it, `wait` enqueues an operation that blocks its stream (not the
//!   caller) until it is raised, `sync_event` blocks the caller and is counted.
//! * Device and page-locked memory are reference-counted word arrays: work in flight keeps what
//!   it touches alive, as the [`Driver`] contract asks.
//! * A launch runs the kernel text through the C++ shim ([`crate::kernel_host`]); a tree launch
//!   ([`Driver::launch_tree`]) the tree entry its views ask for, through the shim's launcher.
//! * Graph capture records a stream's operations instead of running them; a replay enqueues
//!   them again.
//! * [`Faults`] inject slow, failing and never-completing downloads (the readback's copy).
//!
//! Dropping the last handle of a stream stops its worker (releasing an injected hang), so
//! shutdown never waits for ever.

use crate::kernel_host::{LAUNCHER_ENTRY_NAMES, Mode, TREE_ENTRY_INDEX, launch_block};
use specula_core::ErrorKind;
use specula_core::HasKind;
use specula_core::gpu::{ArgBlock, Driver, Element, Launch, Memory, Status, TreeLaunch};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// Why a host-driver call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostDriverError {
    kind: ErrorKind,
    what: String,
}

impl HostDriverError {
    fn new(kind: ErrorKind, what: impl Into<String>) -> Self {
        Self {
            kind,
            what: what.into(),
        }
    }
}

impl HasKind for HostDriverError {
    fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl std::fmt::Display for HostDriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind, self.what)
    }
}

impl std::error::Error for HostDriverError {}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How long a blocked operation sleeps between checks that its stream is closing.
const TICK: Duration = Duration::from_millis(5);

/// Word-aligned memory written through raw pointers by stream workers.
pub struct Mem {
    words: Box<[UnsafeCell<u64>]>,
    bytes: usize,
    /// The driver (the "device") that allocated it ([`Driver::owns`]).
    device: u64,
}

// SAFETY: the memory is only accessed through raw pointers, by operations ordered by streams
// and events (a mutex/condvar hand-off between threads), or by `read_host` under its contract.
unsafe impl Sync for Mem {}
// SAFETY: as above; the cells hold plain words.
unsafe impl Send for Mem {}

impl std::fmt::Debug for Mem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mem({} bytes)", self.bytes)
    }
}

impl Mem {
    fn zeroed(bytes: usize, device: u64) -> Arc<Self> {
        let words = (0..bytes.div_ceil(8)).map(|_| UnsafeCell::new(0)).collect();
        Arc::new(Self {
            words,
            bytes,
            device,
        })
    }

    fn ptr(&self) -> *mut u8 {
        UnsafeCell::raw_get(self.words.as_ptr()).cast()
    }

    /// `ptr() + offset`, checked against the size.
    fn at(&self, offset: usize, bytes: usize) -> Result<*mut u8, HostDriverError> {
        if offset.checked_add(bytes).is_none_or(|end| end > self.bytes) {
            return Err(HostDriverError::new(
                ErrorKind::InvalidInput,
                "copy out of bounds",
            ));
        }
        // SAFETY: in bounds of the allocation, checked just above.
        Ok(unsafe { self.ptr().add(offset) })
    }
}

/// A device buffer (a shared handle).
pub type Buf = Arc<Mem>;

type Op = Arc<dyn Fn(&Closing) -> Result<(), HostDriverError> + Send + Sync>;

/// A stream's closing flag, seen by its blocked operations.
pub struct Closing(AtomicBool);

impl Closing {
    fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// One stream: a worker thread and its queue.
pub struct StreamInner {
    id: u64,
    tx: Mutex<Option<Sender<Op>>>,
    capture: Mutex<Option<Vec<Op>>>,
    /// The error of the last failed operation, handed to the next event recorded.
    error: Arc<Mutex<Option<HostDriverError>>>,
    closing: Arc<Closing>,
    faults: Arc<Faults>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for StreamInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stream")
    }
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        self.closing.0.store(true, Ordering::Release);
        self.faults.wake();
        lock(&self.tx).take();
        if let Some(w) = lock(&self.worker).take() {
            let _ = w.join();
        }
    }
}

/// A stream handle.
pub type Stream = Arc<StreamInner>;

#[derive(Debug, Default)]
struct EventState {
    recorded: u64,
    completed: u64,
    /// The error of the work tracked by completion `.0`.
    error: Option<(u64, HostDriverError)>,
}

/// An event: a completion flag with generations.
#[derive(Debug, Default)]
pub struct EventInner {
    state: Mutex<EventState>,
    cv: Condvar,
}

impl EventInner {
    fn complete(&self, generation: u64, error: Option<HostDriverError>) {
        let mut s = lock(&self.state);
        s.completed = s.completed.max(generation);
        if let Some(e) = error {
            s.error = Some((generation, e));
        }
        self.cv.notify_all();
    }

    /// Blocks until generation `g` is complete or `closing` is set.
    fn block_until(&self, g: u64, closing: &Closing) -> Result<(), HostDriverError> {
        let mut s = lock(&self.state);
        while s.completed < g {
            if closing.is_set() {
                return Err(HostDriverError::new(ErrorKind::Device, "stream closed"));
            }
            s = self
                .cv
                .wait_timeout(s, TICK)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        match &s.error {
            Some((eg, e)) if *eg == g => Err(e.clone()),
            _ => Ok(()),
        }
    }
}

/// An event handle.
pub type Event = Arc<EventInner>;

/// Injected faults of downloads (the readback's device-to-host copy), on every stream or only
/// on the one [`target`](Faults::target)ed.
#[derive(Debug)]
pub struct Faults {
    target: AtomicU64,
    delay_us: AtomicU64,
    fail_next: AtomicU32,
    hang: Mutex<bool>,
    cv: Condvar,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            target: AtomicU64::new(u64::MAX),
            delay_us: AtomicU64::new(0),
            fail_next: AtomicU32::new(0),
            hang: Mutex::new(false),
            cv: Condvar::new(),
        }
    }
}

impl Faults {
    /// Faults apply only to downloads on the stream with this id ([`HostDriver::stream_id`]).
    pub fn target(&self, stream: u64) {
        self.target.store(stream, Ordering::Release);
    }

    /// Every download takes `delay` longer (on its stream's worker, never the caller).
    pub fn set_delay(&self, delay: Duration) {
        let us = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.delay_us.store(us, Ordering::Release);
    }

    /// The next `n` downloads fail (a device error reported by the event recorded after them).
    pub fn fail_next(&self, n: u32) {
        self.fail_next.store(n, Ordering::Release);
    }

    /// Downloads block until [`release`](Faults::release) (or their stream closes).
    pub fn hang(&self) {
        *lock(&self.hang) = true;
    }

    /// Lets blocked downloads finish.
    pub fn release(&self) {
        *lock(&self.hang) = false;
        self.cv.notify_all();
    }

    fn wake(&self) {
        self.cv.notify_all();
    }

    fn on_download(&self, stream: u64, closing: &Closing) -> Result<(), HostDriverError> {
        let target = self.target.load(Ordering::Acquire);
        if target != u64::MAX && target != stream {
            return Ok(());
        }
        let us = self.delay_us.load(Ordering::Acquire);
        if us > 0 {
            std::thread::sleep(Duration::from_micros(us));
        }
        let failing = self
            .fail_next
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(HostDriverError::new(
                ErrorKind::Device,
                "injected copy failure",
            ));
        }
        let mut hung = lock(&self.hang);
        while *hung {
            if closing.is_set() {
                return Err(HostDriverError::new(ErrorKind::Device, "stream closed"));
            }
            hung = self
                .cv
                .wait_timeout(hung, TICK)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        Ok(())
    }
}

/// A captured graph: the operations, replayed in order.
pub struct Graph(Arc<Vec<Op>>);

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Graph({} ops)", self.0.len())
    }
}

#[derive(Debug)]
struct Inner {
    mode: Mode,
    block: u32,
    sms: u32,
    faults: Arc<Faults>,
    syncs: AtomicU64,
    launches: AtomicU64,
    /// Launches run per entry point, indexed as `LAUNCHER_ENTRY_NAMES` (the chain's, the tree's).
    by_entry: [AtomicU64; LAUNCHER_ENTRY_NAMES.len()],
    streams: AtomicU64,
    /// This driver's "device": every [`HostDriver::new`] is another one.
    device: u64,
}

/// The next [`HostDriver::new`]'s device number.
static DEVICES: AtomicU64 = AtomicU64::new(0);

/// The host driver (a shared handle).
#[derive(Clone, Debug)]
pub struct HostDriver {
    inner: Arc<Inner>,
}

impl HostDriver {
    /// Enqueues one launch of entry point `index` (of [`LAUNCHER_ENTRY_NAMES`]) with the
    /// argument block `args`, whose buffers `keep` holds alive until it has run.
    #[allow(clippy::too_many_arguments)]
    fn run_block(
        &self,
        stream: &Stream,
        grid: u32,
        block: u32,
        index: usize,
        args: ArgBlock,
        keep: Vec<Buf>,
        refused: &'static str,
    ) -> Result<(), HostDriverError> {
        let (block, mode) = (block.min(self.inner.block), self.inner.mode);
        let inner = self.inner.clone();
        self.enqueue(
            stream,
            Arc::new(move |_| {
                let _alive = &keep;
                inner.launches.fetch_add(1, Ordering::AcqRel);
                if let Some(n) = inner.by_entry.get(index) {
                    n.fetch_add(1, Ordering::AcqRel);
                }
                // SAFETY: every address in `args` is null or into a buffer `keep` holds alive;
                // the orchestration checked the views against the capacity and the caller of
                // its (unsafe) launch vouched for the shape words (and the cumulative counts,
                // the tree links); stream order excludes other access meanwhile.
                let rc = unsafe { launch_block(mode, grid, block, index as u32, &args) };
                if rc == 0 {
                    Ok(())
                } else {
                    Err(HostDriverError::new(ErrorKind::InvalidInput, refused))
                }
            }),
        )
    }

    /// A driver running the kernel text compiled in `mode`, `block` threads per block (a
    /// multiple of the warp size, at most [`crate::kernel_host::MAX_BLOCK_THREADS`]), reporting
    /// `sms` multiprocessors (batches below that split rows over several blocks).
    #[must_use]
    pub fn new(mode: Mode, block: u32, sms: u32) -> Self {
        Self {
            inner: Arc::new(Inner {
                mode,
                block,
                sms,
                faults: Arc::default(),
                syncs: AtomicU64::new(0),
                launches: AtomicU64::new(0),
                by_entry: Default::default(),
                streams: AtomicU64::new(0),
                device: DEVICES.fetch_add(1, Ordering::Relaxed),
            }),
        }
    }

    /// The fault injector.
    #[must_use]
    pub fn faults(&self) -> &Faults {
        &self.inner.faults
    }

    /// Synchronising calls made so far (`sync_event`, `sync_stream`), by anyone.
    #[must_use]
    pub fn sync_calls(&self) -> u64 {
        self.inner.syncs.load(Ordering::Acquire)
    }

    /// Kernel launches enqueued so far (replays count each launch they hold).
    #[must_use]
    pub fn launches(&self) -> u64 {
        self.inner.launches.load(Ordering::Acquire)
    }

    /// Launches run so far per entry point, as `(name, count)` in the order of
    /// [`LAUNCHER_ENTRY_NAMES`] (the chain's, then the tree's), so a test sees which entry the
    /// orchestration picked.
    #[must_use]
    pub fn launches_by_entry(&self) -> [(&'static str, u64); LAUNCHER_ENTRY_NAMES.len()] {
        core::array::from_fn(|i| {
            (
                LAUNCHER_ENTRY_NAMES[i],
                self.inner.by_entry[i].load(Ordering::Acquire),
            )
        })
    }

    /// Launches run so far of the entry point `name` (one of [`LAUNCHER_ENTRY_NAMES`]; 0 for
    /// another).
    #[must_use]
    pub fn launches_of(&self, name: &str) -> u64 {
        self.launches_by_entry()
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, c)| *c)
    }

    /// A stream's id (streams are numbered in creation order, from 0).
    #[must_use]
    pub fn stream_id(&self, stream: &Stream) -> u64 {
        stream.id
    }

    /// A buffer of this driver's "device" holding `data` (what an engine's tensor in device
    /// memory is to the orchestration), written directly: nothing else refers to it yet.
    #[must_use]
    pub fn buffer_from<T: Element>(&self, data: &[T]) -> Buf {
        let bytes = as_bytes(data);
        let mem = Mem::zeroed(bytes.len(), self.inner.device);
        // SAFETY: a fresh allocation of `bytes.len()` bytes that no one else refers to yet.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), mem.ptr(), bytes.len()) };
        mem
    }

    /// The first `len` elements of `buf` once everything queued on `stream` has run (one
    /// synchronising call, counted in [`sync_calls`](Self::sync_calls)).
    ///
    /// # Panics
    /// If the stream's work failed or `buf` holds fewer than `len` elements.
    #[must_use]
    pub fn read_after<T: Element>(&self, stream: &Stream, buf: &Buf, len: usize) -> Vec<T> {
        self.sync_stream(stream).expect("stream work failed");
        let bytes = len * T::BYTES;
        let p = buf.at(0, bytes).expect("buffer too short");
        // SAFETY: in bounds (checked by `at`); the stream that writes it has drained and the
        // caller enqueues nothing on it meanwhile.
        let raw = unsafe { std::slice::from_raw_parts(p.cast_const(), bytes) };
        raw.chunks_exact(T::BYTES).map(T::read_ne).collect()
    }

    fn enqueue(&self, stream: &Stream, op: Op) -> Result<(), HostDriverError> {
        if let Some(c) = lock(&stream.capture).as_mut() {
            c.push(op);
            return Ok(());
        }
        let tx = lock(&stream.tx);
        let sent = tx.as_ref().map(|t| t.send(op));
        match sent {
            Some(Ok(())) => Ok(()),
            _ => Err(HostDriverError::new(
                ErrorKind::Device,
                "stream worker gone",
            )),
        }
    }
}

fn as_bytes<T: Element>(src: &[T]) -> &[u8] {
    // SAFETY: `Element` is sealed to u32, u64, f32, i32 and u16: no padding, every byte
    // initialised.
    unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), size_of_val(src)) }
}

impl Memory for HostDriver {
    type Buffer = Buf;

    fn bytes(buf: &Buf) -> usize {
        buf.bytes
    }
}

impl Driver for HostDriver {
    type Error = HostDriverError;
    type Stream = Stream;
    type Event = Event;
    type HostBuffer = Buf;
    type Graph = Graph;

    fn stream(&self) -> Result<Stream, HostDriverError> {
        let (tx, rx) = channel::<Op>();
        let error = Arc::new(Mutex::new(None));
        let closing = Arc::new(Closing(AtomicBool::new(false)));
        let (err, clo) = (error.clone(), closing.clone());
        let worker = std::thread::Builder::new()
            .name("host-driver-stream".into())
            .spawn(move || {
                while let Ok(op) = rx.recv() {
                    if let Err(e) = op(&clo) {
                        *lock(&err) = Some(e);
                    }
                }
            })
            .map_err(|e| HostDriverError::new(ErrorKind::Resource, e.to_string()))?;
        Ok(Arc::new(StreamInner {
            id: self.inner.streams.fetch_add(1, Ordering::AcqRel),
            tx: Mutex::new(Some(tx)),
            capture: Mutex::new(None),
            error,
            closing,
            faults: self.inner.faults.clone(),
            worker: Mutex::new(Some(worker)),
        }))
    }

    fn event(&self) -> Result<Event, HostDriverError> {
        Ok(Arc::default())
    }

    fn alloc(&self, bytes: usize) -> Result<Buf, HostDriverError> {
        Ok(Mem::zeroed(bytes, self.inner.device))
    }

    fn alloc_host(&self, bytes: usize) -> Result<Buf, HostDriverError> {
        Ok(Mem::zeroed(bytes, self.inner.device))
    }

    fn upload<T: Element>(
        &self,
        stream: &Stream,
        dst: &Buf,
        offset: usize,
        src: &[T],
    ) -> Result<(), HostDriverError> {
        let data: Arc<[u8]> = as_bytes(src).into(); // staged: the caller may reuse `src`
        dst.at(offset, data.len())?;
        let dst = dst.clone();
        self.enqueue(
            stream,
            Arc::new(move |_| {
                let p = dst.at(offset, data.len())?;
                // SAFETY: `p` is in bounds for `data.len()` bytes of `dst`, kept alive by the
                // captured Arc; stream order excludes other access meanwhile.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
                Ok(())
            }),
        )
    }

    fn copy(
        &self,
        stream: &Stream,
        dst: &Buf,
        src: &Buf,
        bytes: usize,
    ) -> Result<(), HostDriverError> {
        let (dst, src) = (dst.clone(), src.clone());
        self.enqueue(
            stream,
            Arc::new(move |_| {
                let (d, s) = (dst.at(0, bytes)?, src.at(0, bytes)?);
                // SAFETY: both in bounds, alive (captured Arcs), distinct buffers in the
                // orchestration's use; `copy` tolerates overlap anyway.
                unsafe { std::ptr::copy(s, d, bytes) };
                Ok(())
            }),
        )
    }

    fn download(
        &self,
        stream: &Stream,
        dst: &Buf,
        dst_offset: usize,
        src: &Buf,
        src_offset: usize,
        bytes: usize,
    ) -> Result<(), HostDriverError> {
        let (dst, src) = (dst.clone(), src.clone());
        let faults = self.inner.faults.clone();
        let id = stream.id;
        self.enqueue(
            stream,
            Arc::new(move |closing| {
                faults.on_download(id, closing)?;
                let (d, s) = (dst.at(dst_offset, bytes)?, src.at(src_offset, bytes)?);
                // SAFETY: both in bounds and alive (captured Arcs).
                unsafe { std::ptr::copy(s, d, bytes) };
                Ok(())
            }),
        )
    }

    unsafe fn read_host<T: Element>(&self, buf: &Buf, offset: usize, out: &mut [T]) {
        let n = size_of_val(out);
        let Ok(p) = buf.at(offset, n) else {
            return; // out of bounds: the orchestration never asks
        };
        // SAFETY: in bounds; the caller guarantees no copy into `buf` is in flight; any byte
        // pattern is a valid u32/u64/f32.
        unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr().cast::<u8>(), n) };
    }

    fn record(&self, event: &Event, stream: &Stream) -> Result<(), HostDriverError> {
        let g = {
            let mut s = lock(&event.state);
            s.recorded += 1;
            s.recorded
        };
        let (ev, err) = (event.clone(), stream.error.clone());
        self.enqueue(
            stream,
            Arc::new(move |_| {
                ev.complete(g, lock(&err).take());
                Ok(())
            }),
        )
    }

    fn wait(&self, stream: &Stream, event: &Event) -> Result<(), HostDriverError> {
        let g = lock(&event.state).recorded;
        let ev = event.clone();
        // A failure of the awaited work is the other stream's: this one goes on.
        self.enqueue(
            stream,
            Arc::new(move |closing| {
                let _ = ev.block_until(g, closing);
                Ok(())
            }),
        )
    }

    fn query(&self, event: &Event) -> Result<Status, HostDriverError> {
        let s = lock(&event.state);
        if s.completed < s.recorded {
            return Ok(Status::Pending);
        }
        match &s.error {
            Some((g, e)) if *g == s.recorded => Err(e.clone()),
            _ => Ok(Status::Ready),
        }
    }

    fn sync_event(&self, event: &Event) -> Result<(), HostDriverError> {
        self.inner.syncs.fetch_add(1, Ordering::AcqRel);
        let g = lock(&event.state).recorded;
        // The caller is not a stream: it waits until the event completes.
        let never = Closing(AtomicBool::new(false));
        event.block_until(g, &never)
    }

    fn sync_stream(&self, stream: &Stream) -> Result<(), HostDriverError> {
        let ev: Event = Arc::default();
        self.record(&ev, stream)?;
        self.sync_event(&ev)
    }

    /// Nothing to wait for: page-locked buffers are reference-counted by the copies into them,
    /// and a shutdown must return while an injected hang holds a copy.
    fn drain_copies(&self, _: &Stream) {}

    fn launch(&self, stream: &Stream, l: &Launch<'_, '_, Self>) -> Result<(), HostDriverError> {
        // The kernel's one parameter, as `Launch::arg_block` gives every driver: host addresses
        // of the buffers (which `keep` holds alive until the launch has run).
        let mut keep: Vec<Buf> = Vec::new();
        let args = l.arg_block(|b| {
            keep.push(b.clone());
            b.ptr() as usize as u64
        });
        let index = l.entry_index();
        self.run_block(
            stream,
            l.grid,
            l.block,
            index,
            args,
            keep,
            "launcher refused",
        )
    }

    fn begin_capture(&self, stream: &Stream) -> Result<(), HostDriverError> {
        let mut c = lock(&stream.capture);
        if c.is_some() {
            return Err(HostDriverError::new(ErrorKind::Misuse, "already capturing"));
        }
        *c = Some(Vec::new());
        Ok(())
    }

    fn end_capture(&self, stream: &Stream) -> Result<Graph, HostDriverError> {
        lock(&stream.capture)
            .take()
            .map(|ops| Graph(Arc::new(ops)))
            .ok_or_else(|| HostDriverError::new(ErrorKind::Misuse, "not capturing"))
    }

    fn replay(&self, graph: &Graph, stream: &Stream) -> Result<(), HostDriverError> {
        let ops = graph.0.clone();
        self.enqueue(
            stream,
            Arc::new(move |closing| ops.iter().try_for_each(|op| op(closing))),
        )
    }

    /// Only its own allocations: another [`HostDriver::new`] is another device.
    fn owns(&self, buf: &Buf) -> bool {
        buf.device == self.inner.device
    }

    fn multiprocessors(&self) -> u32 {
        self.inner.sms
    }

    fn block_threads(&self) -> u32 {
        self.inner.block
    }

    fn launch_tree(
        &self,
        stream: &Stream,
        l: &TreeLaunch<'_, '_, Self>,
    ) -> Result<(), HostDriverError> {
        let mut keep: Vec<Buf> = Vec::new();
        let args = l.arg_block(|b| {
            keep.push(b.clone());
            b.ptr() as usize as u64
        });
        let (grid, block) = (l.grid, l.block);
        // The entry the views ask for (binary32 or half rows), as the launcher indexes it.
        let index = TREE_ENTRY_INDEX as usize + l.entry_index();
        self.run_block(
            stream,
            grid,
            block,
            index,
            args,
            keep,
            "tree launcher refused",
        )
    }
}
