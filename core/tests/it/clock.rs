//! The virtual clock tests drive the collector with.

#[test]
fn virtual_clock_moves_forward_only() {
    use specula_core::{Clock, VirtualClock};
    let c = VirtualClock::new(40);
    assert_eq!(c.now_ns(), 40);
    c.advance(2);
    assert_eq!(c.now_ns(), 42);
    c.set(100);
    assert_eq!(c.now_ns(), 100);
    c.set(50);
    assert_eq!(c.now_ns(), 100, "set never moves it back");
    let by_ref: &VirtualClock = &c;
    assert_eq!(Clock::now_ns(&by_ref), 100);
    c.advance(u64::MAX);
    assert_eq!(c.now_ns(), u64::MAX, "saturates");
    assert_eq!(VirtualClock::default().now_ns(), 0);
}
