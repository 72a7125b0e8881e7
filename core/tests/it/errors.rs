//! Error types: what they display and how they debug-print (operators read these).

use crate::support::{dbg, fmt};
use specula_core::error_kind::ErrorKind;

use specula_core::CountError;

#[test]
fn count_errors_display() {
    assert_eq!(fmt(&CountError::EmptyDraft), "draft length k is 0");
    assert_eq!(
        fmt(&CountError::DraftTooLong { k: 9, max: 4 }),
        "draft length 9 exceeds maximum 4"
    );
    assert_eq!(
        fmt(&CountError::AcceptedExceedsDraft { accepted: 3, k: 2 }),
        "3 tokens accepted of a 2-token draft"
    );
    assert_eq!(
        dbg(&CountError::DraftTooLong { k: 9, max: 4 }),
        "DraftTooLong { k: 9, max: 4 }"
    );
}

#[test]
fn error_kinds_display_their_names() {
    let all = [
        (ErrorKind::NotCompiledIn, "not compiled in"),
        (ErrorKind::NoDriver, "no driver"),
        (ErrorKind::NoDevice, "no device"),
        (ErrorKind::NoCompiler, "no kernel compiler"),
        (ErrorKind::Compile, "kernel compilation failed"),
        (ErrorKind::InvalidInput, "invalid input"),
        (ErrorKind::Misuse, "misuse"),
        (ErrorKind::Device, "device failure"),
        (ErrorKind::Resource, "resource exhausted"),
    ];
    for (kind, name) in all {
        assert_eq!(kind.as_str(), name);
        assert_eq!(fmt(&kind), name);
    }
    assert_eq!(dbg(&ErrorKind::NoDevice), "NoDevice");
}
