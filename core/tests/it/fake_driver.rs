//! The one fake GPU driver of the orchestration's tests: a deterministic [`Driver`] (chain and
//! tree launches) whose streams are queues the test drains step by step ([`Fake::new`]; every
//! pending/ready state, ordering and fault is under the test's control) or that run each op as
//! it is enqueued ([`Fake::immediate`]: for tests that look at what was staged or launched).
//! Its fake kernels write values derived from their inputs, so a test sees exactly what was
//! staged, launched, replayed and copied down. (The host driver of `specula-tests` runs the
//! same orchestration with real threads and the kernel text; this one is what the mutation
//! tests judge.)

#![allow(dead_code)] // each test module uses part of it

use specula_core::gpu::kernels;
use specula_core::gpu::{
    ArgBlock, Driver, Element, Entry, Family, Launch, Memory, RowsView, Status, TreeLaunch, View,
};
use specula_core::{ErrorKind, HasKind};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

/// The counters' `K` of every verifier the tests build on the fake.
pub const K: usize = 4;

#[derive(Clone, Debug, PartialEq)]
pub struct FakeError(pub ErrorKind);

impl HasKind for FakeError {
    fn kind(&self) -> ErrorKind {
        self.0
    }
}

impl std::fmt::Display for FakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "fake {}", self.0)
    }
}

#[derive(Debug)]
pub struct Mem {
    pub id: usize,
    pub data: Mutex<Vec<u8>>,
}
// Arc + Mutex, not Rc + RefCell: `verify::Device` views need `Send + Sync` buffers.
pub type Buf = Arc<Mem>;

#[derive(Debug, Default)]
pub struct Ev {
    pub recorded: Cell<u64>,
    pub completed: Cell<u64>,
    pub failed: Cell<u64>,
}
pub type Event = Rc<Ev>;

#[derive(Clone, Debug)]
pub struct LaunchRec {
    pub entry: Entry,
    pub grid: u32,
    pub block: u32,
    /// (buffer id, byte offset) of shape, k, accepted, tokens, stats.
    pub shape: (usize, usize),
    pub k: (usize, usize),
    pub accepted: (usize, usize),
    pub stats: usize,
    pub scratch: Option<(usize, usize)>,
    pub draft_probs: bool,
    pub family: Family,
    pub name: &'static str,
    /// `Launch::arg_block` with the fake's addresses ([`address`], [`at`] reads them back).
    pub args: ArgBlock,
}

/// The fake's device address of a buffer: its id + 1 in the high word (so 0 stays null), the
/// byte offset in the low one.
pub fn address(b: &Buf) -> u64 {
    (b.id as u64 + 1) << 32
}

/// (buffer id, byte offset) of an argument block's address, `None` for null.
pub fn at(a: u64) -> Option<(usize, usize)> {
    (a != 0).then(|| (((a >> 32) - 1) as usize, (a & 0xFFFF_FFFF) as usize))
}

/// The record, the buffers and offsets of shape, k, accepted, stats, tokens, and the cumulative
/// counts when the launch passes them (the fake kernel reads `k` from them).
#[derive(Debug)]
/// A recorded launch, its buffers (shape, k, accepted, stats, tokens) and offsets, the
/// cumulative counts and the recovered-token output when given.
pub struct LaunchOp(
    pub LaunchRec,
    pub [Buf; 5],
    pub [usize; 5],
    pub Option<(Buf, usize)>,
    pub Option<(Buf, usize, usize)>,
);

#[derive(Clone, Debug)]
pub enum Op {
    Upload(Buf, usize, Vec<u8>),
    Copy(Buf, Buf, usize),
    Download(Buf, usize, Buf, usize, usize),
    Record(Event, u64),
    Wait(Event, u64),
    Launch(Rc<LaunchOp>),
    /// The fake tree kernel (it reads and writes the buffers when the stream runs it).
    Kernel(Kernel),
    Replay(Rc<Vec<Op>>),
}

/// A closure a stream runs, as a fake kernel's work.
#[derive(Clone)]
pub struct Kernel(pub Rc<dyn Fn()>);

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Kernel")
    }
}

#[derive(Debug, Default)]
pub struct StreamState {
    pub queue: RefCell<VecDeque<Op>>,
    pub capture: RefCell<Option<Vec<Op>>>,
    pub failed: Cell<bool>,
}
pub type Stream = Rc<StreamState>;

#[derive(Debug, Default)]
pub struct State {
    pub next_id: Cell<usize>,
    pub streams: RefCell<Vec<Stream>>,
    pub launches: RefCell<Vec<LaunchRec>>,
    pub syncs: Cell<u64>,
    pub fail_downloads: Cell<u32>,
    pub fail_calls: Cell<bool>,
    /// Every op enqueued (or captured): "nothing enqueued" checks read it.
    pub ops: Cell<u64>,
    /// Run each op as it is enqueued (outside a capture) instead of queueing it.
    pub immediate: Cell<bool>,
    /// What each tree launch was given, in the order the launches ran.
    pub tree_launches: RefCell<Vec<TreeRec>>,
    /// The fake tree kernel ORs this into the error word.
    pub flags: Cell<u64>,
    /// `launch_tree` fails.
    pub fail_launch: Cell<bool>,
    /// `prepare_tree` calls, and how many found a stream capturing.
    pub prepared: Cell<u32>,
    pub prepared_while_capturing: Cell<u32>,
    /// `prepare_tree` fails.
    pub fail_prepare: Cell<bool>,
    /// `owns` answers false for this buffer id (memory of another device).
    pub foreign: Cell<Option<usize>>,
}

#[derive(Clone, Debug)]
pub struct Fake {
    pub st: Rc<State>,
    pub sms: u32,
}

impl Fake {
    pub fn new(sms: u32) -> Self {
        Self {
            st: Rc::default(),
            sms,
        }
    }

    /// A fake whose streams run every op at once (outside a capture): for tests that look at
    /// what was staged or launched without stepping the streams.
    pub fn immediate(sms: u32) -> Self {
        let f = Self::new(sms);
        f.st.immediate.set(true);
        f
    }

    pub fn tree_launches(&self) -> Vec<TreeRec> {
        self.st.tree_launches.borrow().clone()
    }

    pub fn id(&self) -> usize {
        let i = self.st.next_id.get();
        self.st.next_id.set(i + 1);
        i
    }

    pub fn push(&self, s: &Stream, op: Op) -> Result<(), FakeError> {
        if self.st.fail_calls.get() {
            return Err(FakeError(ErrorKind::Device));
        }
        self.st.ops.set(self.st.ops.get() + 1);
        if let Some(c) = s.capture.borrow_mut().as_mut() {
            c.push(op);
            return Ok(());
        }
        if self.st.immediate.get() {
            self.exec(s, &op);
            return Ok(());
        }
        s.queue.borrow_mut().push_back(op);
        Ok(())
    }

    /// Runs the first queued op of `s` if it can; false if blocked or empty.
    pub fn step(&self, s: &Stream) -> bool {
        let Some(op) = s.queue.borrow().front().cloned() else {
            return false;
        };
        if matches!(&op, Op::Wait(ev, g) if ev.completed.get() < *g) {
            return false;
        }
        s.queue.borrow_mut().pop_front();
        self.exec(s, &op);
        true
    }

    pub fn exec(&self, s: &Stream, op: &Op) {
        match op {
            Op::Upload(dst, off, data) => {
                dst.data.lock().unwrap()[*off..off + data.len()].copy_from_slice(data);
            }
            Op::Copy(dst, src, n) => {
                let v = src.data.lock().unwrap()[..*n].to_vec();
                dst.data.lock().unwrap()[..*n].copy_from_slice(&v);
            }
            Op::Download(dst, doff, src, soff, n) => {
                let f = self.st.fail_downloads.get();
                if f > 0 {
                    self.st.fail_downloads.set(f - 1);
                    s.failed.set(true);
                    return;
                }
                let v = src.data.lock().unwrap()[*soff..soff + n].to_vec();
                dst.data.lock().unwrap()[*doff..doff + n].copy_from_slice(&v);
            }
            Op::Record(ev, g) => {
                ev.completed.set(ev.completed.get().max(*g));
                if s.failed.replace(false) {
                    ev.failed.set(*g);
                }
            }
            Op::Wait(..) => {}
            Op::Launch(l) => {
                let LaunchOp(rec, bufs, offs, cu, rec_out) = &**l;
                self.st.launches.borrow_mut().push(rec.clone());
                // The fake kernel: drafts += batch word; accepted[b] = k[b] + 100 (k[b] from
                // the cumulative counts when given); tokens[i] = 200 + i over B · (k_max + 1).
                let [shape, k, accepted, stats, tokens] = bufs;
                let batch = u32::read_ne(&shape.data.lock().unwrap()[offs[0]..]) as usize;
                let k_max = u32::read_ne(&shape.data.lock().unwrap()[offs[0] + 4..]) as usize;
                for i in 0..batch * (k_max + 1) {
                    (200 + i as u32).write_ne(&mut tokens.data.lock().unwrap()[offs[4] + 4 * i..]);
                }
                let mut st = stats.data.lock().unwrap();
                let drafts = u64::read_ne(&st[..]) + batch as u64;
                drafts.write_ne(&mut st[..8]);
                drop(st);
                for b in 0..batch {
                    let kb = match cu {
                        Some((c, at)) => {
                            let word =
                                |i: usize| u32::read_ne(&c.data.lock().unwrap()[at + 4 * i..]);
                            word(b) - if b == 0 { 0 } else { word(b - 1) }
                        }
                        None => u32::read_ne(&k.data.lock().unwrap()[offs[1] + 4 * b..]),
                    };
                    (kb + 100).write_ne(&mut accepted.data.lock().unwrap()[offs[2] + 4 * b..]);
                }
                // recovered[i] = 300 + i over the view.
                if let Some((r, at, len)) = rec_out {
                    for i in 0..*len {
                        (300 + i as u32).write_ne(&mut r.data.lock().unwrap()[at + 4 * i..]);
                    }
                }
            }
            Op::Kernel(k) => (k.0)(),
            Op::Replay(ops) => {
                for o in ops.iter() {
                    self.exec(s, o);
                }
            }
        }
    }

    /// Runs every stream until none can progress.
    pub fn run(&self) {
        let streams = self.st.streams.borrow().clone();
        while streams.iter().any(|s| self.step(s)) {}
    }

    /// Runs only stream `s` until it blocks or empties.
    pub fn run_stream(&self, s: &Stream) {
        while self.step(s) {}
    }

    pub fn launches(&self) -> Vec<LaunchRec> {
        self.st.launches.borrow().clone()
    }

    pub fn pending_ops(&self) -> usize {
        self.st
            .streams
            .borrow()
            .iter()
            .map(|s| s.queue.borrow().len())
            .sum()
    }
}

impl Memory for Fake {
    type Buffer = Buf;

    fn bytes(buf: &Buf) -> usize {
        buf.data.lock().unwrap().len()
    }
}

impl Driver for Fake {
    type Error = FakeError;
    type Stream = Stream;
    type Event = Event;
    type HostBuffer = Buf;
    type Graph = Rc<Vec<Op>>;

    fn stream(&self) -> Result<Stream, FakeError> {
        let s: Stream = Rc::default();
        self.st.streams.borrow_mut().push(s.clone());
        Ok(s)
    }
    fn event(&self) -> Result<Event, FakeError> {
        Ok(Rc::default())
    }
    fn alloc(&self, bytes: usize) -> Result<Buf, FakeError> {
        if self.st.fail_calls.get() {
            return Err(FakeError(ErrorKind::Resource));
        }
        Ok(Arc::new(Mem {
            id: self.id(),
            data: Mutex::new(vec![0; bytes]),
        }))
    }
    fn alloc_host(&self, bytes: usize) -> Result<Buf, FakeError> {
        self.alloc(bytes)
    }
    fn upload<T: Element>(
        &self,
        s: &Stream,
        dst: &Buf,
        offset: usize,
        src: &[T],
    ) -> Result<(), FakeError> {
        let mut bytes = vec![0u8; src.len() * T::BYTES];
        for (x, out) in src.iter().zip(bytes.chunks_mut(T::BYTES)) {
            x.write_ne(out);
        }
        self.push(s, Op::Upload(dst.clone(), offset, bytes))
    }
    fn copy(&self, s: &Stream, dst: &Buf, src: &Buf, bytes: usize) -> Result<(), FakeError> {
        self.push(s, Op::Copy(dst.clone(), src.clone(), bytes))
    }
    fn download(
        &self,
        s: &Stream,
        dst: &Buf,
        dst_offset: usize,
        src: &Buf,
        src_offset: usize,
        bytes: usize,
    ) -> Result<(), FakeError> {
        let op = Op::Download(dst.clone(), dst_offset, src.clone(), src_offset, bytes);
        self.push(s, op)
    }
    unsafe fn read_host<T: Element>(&self, buf: &Buf, offset: usize, out: &mut [T]) {
        let d = buf.data.lock().unwrap();
        for (i, x) in out.iter_mut().enumerate() {
            *x = T::read_ne(&d[offset + i * T::BYTES..]);
        }
    }
    fn record(&self, ev: &Event, s: &Stream) -> Result<(), FakeError> {
        let g = ev.recorded.get() + 1;
        ev.recorded.set(g);
        self.push(s, Op::Record(ev.clone(), g))
    }
    fn wait(&self, s: &Stream, ev: &Event) -> Result<(), FakeError> {
        self.push(s, Op::Wait(ev.clone(), ev.recorded.get()))
    }
    fn query(&self, ev: &Event) -> Result<Status, FakeError> {
        if ev.completed.get() < ev.recorded.get() {
            Ok(Status::Pending)
        } else if ev.failed.get() == ev.recorded.get() && ev.recorded.get() > 0 {
            Err(FakeError(ErrorKind::Device))
        } else {
            Ok(Status::Ready)
        }
    }
    fn sync_event(&self, ev: &Event) -> Result<(), FakeError> {
        self.st.syncs.set(self.st.syncs.get() + 1);
        self.run();
        match self.query(ev)? {
            Status::Ready => Ok(()),
            Status::Pending => Err(FakeError(ErrorKind::Device)), // would hang
        }
    }
    fn sync_stream(&self, s: &Stream) -> Result<(), FakeError> {
        self.st.syncs.set(self.st.syncs.get() + 1);
        self.run();
        if s.queue.borrow().is_empty() {
            Ok(())
        } else {
            Err(FakeError(ErrorKind::Device))
        }
    }
    fn launch(&self, s: &Stream, l: &Launch<'_, '_, Self>) -> Result<(), FakeError> {
        let a = l.args;
        let at = |b: &Buf, o: usize| (b.id, o);
        let rec = LaunchRec {
            entry: l.entry,
            grid: l.grid,
            block: l.block,
            shape: at(a.step.shape.buffer(), a.step.shape.byte_offset()),
            k: at(a.k.buffer(), a.k.byte_offset()),
            accepted: at(a.step.accepted.buffer(), a.step.accepted.byte_offset()),
            stats: l.stats.id,
            scratch: l.scratch.map(|b| (b.id, Self::bytes(b))),
            draft_probs: a.step.draft_probs.is_some_and(|d| !d.is_half()),
            family: a.inputs().family(),
            name: l.entry_name(),
            args: l.arg_block(address),
        };
        let cu = a
            .cu_num_draft_tokens
            .map(|v| (v.buffer().clone(), v.byte_offset()));
        let bufs = [
            a.step.shape.buffer().clone(),
            a.k.buffer().clone(),
            a.step.accepted.buffer().clone(),
            l.stats.clone(),
            a.step.tokens.buffer().clone(),
        ];
        let offs = [
            a.step.shape.byte_offset(),
            a.k.byte_offset(),
            a.step.accepted.byte_offset(),
            0,
            a.step.tokens.byte_offset(),
        ];
        let rec_out = a
            .recovered
            .as_ref()
            .map(|v| (v.buffer().clone(), v.byte_offset(), v.len()));
        self.push(
            s,
            Op::Launch(Rc::new(LaunchOp(rec, bufs, offs, cu, rec_out))),
        )
    }
    fn begin_capture(&self, s: &Stream) -> Result<(), FakeError> {
        *s.capture.borrow_mut() = Some(Vec::new());
        Ok(())
    }
    fn end_capture(&self, s: &Stream) -> Result<Rc<Vec<Op>>, FakeError> {
        s.capture
            .borrow_mut()
            .take()
            .map(Rc::new)
            .ok_or(FakeError(ErrorKind::Misuse))
    }
    fn replay(&self, g: &Rc<Vec<Op>>, s: &Stream) -> Result<(), FakeError> {
        self.push(s, Op::Replay(g.clone()))
    }
    fn owns(&self, buf: &Buf) -> bool {
        self.st.foreign.get() != Some(buf.id)
    }
    fn multiprocessors(&self) -> u32 {
        self.sms
    }
    fn block_threads(&self) -> u32 {
        96
    }

    fn prepare_tree(&self) -> Result<(), FakeError> {
        self.st.prepared.set(self.st.prepared.get() + 1);
        if self
            .st
            .streams
            .borrow()
            .iter()
            .any(|s| s.capture.borrow().is_some())
        {
            let n = self.st.prepared_while_capturing.get();
            self.st.prepared_while_capturing.set(n + 1);
        }
        if self.st.fail_prepare.get() {
            return Err(FakeError(ErrorKind::Compile));
        }
        Ok(())
    }

    /// The fake tree kernel: per request of the batch word, `accepted[b] = nodes[b] + 100`;
    /// `path[i] = 300 + i` and `tokens[i] = 400 + i` over `B · (max_depth + 1)`; the drafts
    /// counter grows by `B`, and the error word takes the injected flags.
    fn launch_tree(&self, s: &Stream, l: &TreeLaunch<'_, '_, Self>) -> Result<(), FakeError> {
        if self.st.fail_launch.get() {
            return Err(FakeError(ErrorKind::Device));
        }
        let a = l.args;
        let rec = TreeRec {
            grid: l.grid,
            block: l.block,
            stats: l.stats.id,
            draft: a.step.draft_probs.is_some_and(|d| !d.is_half()),
            entry: l.entry_name(),
            args: l.arg_block(address),
        };
        let view = |b: &Buf, o: usize| (b.clone(), o);
        let (shape, nodes) = (
            view(a.step.shape.buffer(), a.step.shape.byte_offset()),
            view(a.nodes.buffer(), a.nodes.byte_offset()),
        );
        let (acc, path, tok) = (
            view(a.step.accepted.buffer(), a.step.accepted.byte_offset()),
            view(a.path.buffer(), a.path.byte_offset()),
            view(a.step.tokens.buffer(), a.step.tokens.byte_offset()),
        );
        let (stats, st) = (l.stats.clone(), self.st.clone());
        self.push(
            s,
            Op::Kernel(Kernel(Rc::new(move || {
                st.tree_launches.borrow_mut().push(rec.clone());
                let batch = read::<u32>(&shape.0, shape.1) as usize;
                let depth = read::<u32>(&shape.0, shape.1 + 4) as usize;
                for b in 0..batch {
                    let n: u32 = read(&nodes.0, nodes.1 + 4 * b);
                    write(&acc.0, acc.1 + 4 * b, n + 100);
                }
                for i in 0..batch * (depth + 1) {
                    write(&path.0, path.1 + 4 * i, 300 + i as u32);
                    write(&tok.0, tok.1 + 4 * i, 400 + i as u32);
                }
                let drafts: u64 = read(&stats, 0);
                write(&stats, 0, drafts + batch as u64);
                let e = 8 * kernels::error_word(K);
                let flags: u64 = read(&stats, e);
                write(&stats, e, flags | st.flags.get());
            }))),
        )
    }
}

/// What a tree launch was given.
#[derive(Clone, Debug, PartialEq)]
pub struct TreeRec {
    pub grid: u32,
    pub block: u32,
    pub stats: usize,
    pub draft: bool,
    /// The tree entry point the launch named (`TreeLaunch::entry_name`).
    pub entry: &'static str,
    /// `TreeLaunch::arg_block` with the fake's addresses.
    pub args: ArgBlock,
}

pub fn read<T: Element>(b: &Buf, byte: usize) -> T {
    T::read_ne(&b.data.lock().unwrap()[byte..])
}

pub fn write<T: Element>(b: &Buf, byte: usize, x: T) {
    x.write_ne(&mut b.data.lock().unwrap()[byte..]);
}

/// Rows' binary32 view (`None` for half rows).
pub fn f32_rows(r: RowsView<'_, Fake>) -> Option<View<'_, Fake, f32>> {
    match r {
        RowsView::F32(v) => Some(v),
        RowsView::Half(_) => None,
    }
}

/// Rows' bf16 / f16 view (`None` for binary32 rows).
pub fn half_rows(r: RowsView<'_, Fake>) -> Option<View<'_, Fake, u16>> {
    match r {
        RowsView::Half(v) => Some(v),
        RowsView::F32(_) => None,
    }
}

/// Rows one element shorter, in their format.
pub fn short_rows(r: RowsView<'_, Fake>) -> RowsView<'_, Fake> {
    match r {
        RowsView::F32(v) => RowsView::F32(View::range(v.buffer(), 0, v.len() - 1).unwrap()),
        RowsView::Half(v) => RowsView::Half(View::range(v.buffer(), 0, v.len() - 1).unwrap()),
    }
}

/// A device buffer's elements `at..at + n` of a view.
pub fn elems<T: Element>(v: &View<'_, Fake, T>) -> Vec<T> {
    (0..v.len())
        .map(|i| read(v.buffer(), v.byte_offset() + i * T::BYTES))
        .collect()
}
