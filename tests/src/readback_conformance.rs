//! The [`Readback`] conformance suite: the contract of `specula_core::metrics::Readback`, misuse
//! included (defined once, in [`specula_core::Misuse`]), checked the same way on every
//! implementation — the host and CPU readbacks, the GPU orchestration's ring over the host
//! driver, and CUDA and ROCm when a device is lent.

use specula_core::{Counters, ErrorKind, HasKind, Readback};
use std::task::Poll;
use std::time::Duration;

/// A readback together with the counters it reads.
pub trait Rig<const K: usize> {
    /// The readback under test.
    type R: Readback<K>;
    /// The readback.
    fn readback(&mut self) -> &mut Self::R;
    /// Counts at least one more draft where the readback reads from (a verification step).
    fn step(&mut self);
    /// The totals counted so far (blocking is fine: this is the test's truth).
    fn totals(&mut self) -> Counters<K>;
}

/// Polls until ready, sleeping between polls; panics after about 20 s (a hang is a failure).
pub fn poll_ready<const K: usize, R: Readback<K>>(r: &mut R) -> Result<Counters<K>, R::Error> {
    for _ in 0..100_000 {
        match r.poll() {
            Poll::Ready(x) => return x,
            Poll::Pending => std::thread::sleep(Duration::from_micros(200)),
        }
    }
    panic!("readback never completed");
}

fn assert_misuse<E: HasKind + std::fmt::Debug>(e: &E, what: &str) {
    assert_eq!(e.kind(), ErrorKind::Misuse, "{what}: {e:?}");
}

/// Every check, each on a fresh rig from `make`.
pub fn run_all<const K: usize, G: Rig<K>>(mut make: impl FnMut() -> G)
where
    <G::R as Readback<K>>::Error: HasKind,
{
    misuse(&mut make());
    snapshots_in_start_order(&mut make());
    flush_retires_everything(&mut make());
    abandon(&mut make());
}

/// Poll with nothing in flight, and start with `max_in_flight` in flight, are misuse
/// (`ErrorKind::Misuse`), and a refused start changes nothing.
pub fn misuse<const K: usize, G: Rig<K>>(g: &mut G)
where
    <G::R as Readback<K>>::Error: HasKind,
{
    match g.readback().poll() {
        Poll::Ready(Err(e)) => assert_misuse(&e, "poll without start"),
        Poll::Ready(Ok(c)) => panic!("poll without start answered {c:?}"),
        Poll::Pending => panic!("poll without start answered Pending"),
    }
    assert!(!g.readback().abandon(), "abandon with nothing in flight");
    let n = g.readback().max_in_flight().max(1);
    for _ in 0..n {
        g.step();
        g.readback().start().expect("start below max_in_flight");
    }
    let e = g
        .readback()
        .start()
        .expect_err("start with max_in_flight in flight");
    assert_misuse(&e, "start while full");
    for _ in 0..n {
        poll_ready(g.readback()).expect("the copies started before the refused one");
    }
    match g.readback().poll() {
        Poll::Ready(Err(e)) => assert_misuse(&e, "poll after the last copy"),
        other => panic!("poll after the last copy answered {other:?}"),
    }
}

/// Each copy is the counters as of its start, copies complete in start order, each at least
/// the previous.
pub fn snapshots_in_start_order<const K: usize, G: Rig<K>>(g: &mut G) {
    let n = g.readback().max_in_flight().max(1);
    let mut expected = Vec::new();
    for _ in 0..n {
        g.step();
        expected.push(g.totals());
        g.readback().start().expect("start");
    }
    g.step(); // after every start: in none of the copies
    let mut last = Counters::<K>::ZERO;
    for want in expected {
        let got = poll_ready(g.readback()).expect("copy");
        assert_eq!(got, want, "the counters as of its start");
        assert!(got.drafts >= last.drafts);
        last = got;
    }
}

/// Flush returns the totals so far with copies in flight or not, and retires every copy.
pub fn flush_retires_everything<const K: usize, G: Rig<K>>(g: &mut G)
where
    <G::R as Readback<K>>::Error: HasKind,
{
    g.step();
    assert_eq!(g.readback().flush().expect("flush"), g.totals());
    g.step();
    g.readback().start().expect("start");
    g.step();
    let want = g.totals();
    assert_eq!(g.readback().flush().expect("flush"), want);
    match g.readback().poll() {
        Poll::Ready(Err(e)) => assert_misuse(&e, "poll after flush"),
        other => panic!("poll after flush answered {other:?}"),
    }
    assert!(!g.readback().abandon(), "flush retired the copy");
    g.readback().start().expect("start after flush");
    assert_eq!(poll_ready(g.readback()).expect("copy"), want);
}

/// Abandoning the oldest copy either releases it (it is never answered, and another may start
/// in its place) or keeps it (it is still answered).
pub fn abandon<const K: usize, G: Rig<K>>(g: &mut G)
where
    <G::R as Readback<K>>::Error: HasKind,
{
    g.step();
    let first = g.totals();
    g.readback().start().expect("start");
    if g.readback().abandon() {
        match g.readback().poll() {
            Poll::Ready(Err(e)) => assert_misuse(&e, "poll after abandoning the only copy"),
            other => panic!("an abandoned copy was answered: {other:?}"),
        }
        g.step();
        let second = g.totals();
        g.readback().start().expect("start in its place");
        assert_eq!(poll_ready(g.readback()).expect("copy"), second);
    } else {
        assert_eq!(poll_ready(g.readback()).expect("kept copy"), first);
    }
}
