//! The demo's sampling flags (temperature, top-k, top-p, min-p, greedy requests): they reach the
//! verifier, and bad values exit 2.

use crate::support::{demo, error_line, expect_code, final_field, final_of};

#[test]
fn sampling_flags_mix_greedy_and_filtered_requests() {
    let mixed = final_of(&[
        "--temperature",
        "0.7",
        "--top-p",
        "0.9",
        "--top-k",
        "40",
        "--min-p",
        "0.02",
        "--greedy-requests",
        "2",
    ]);
    assert!(final_field(&mixed, "emitted_tokens") >= 40, "{mixed}");
    // The filters reach the verifier: top-k 1 (the target's argmax only) changes the run.
    let plain = final_of(&["--temperature", "1"]);
    let top1 = final_of(&["--temperature", "1", "--top-k", "1"]);
    assert_ne!(plain, top1, "top-k 1 changed nothing");
}

#[test]
fn greedy_requests_in_a_sampled_batch_verify_as_the_greedy_demo() {
    // Every request greedy (T = 0 in a rejection-sampling batch from logits) gives the counts
    // of the greedy method on probabilities: same drafts (argmax), same argmax verification.
    let mixed = final_of(&["--greedy-requests", "8", "--temperature", "1"]);
    let greedy = final_of(&["--method", "greedy"]);
    assert_eq!(mixed, greedy);
}

#[test]
fn bad_sampling_flags_exit_2() {
    for (args, what) in [
        (&["--top-p", "0"][..], "top-p"),
        (&["--top-p", "1.5"][..], "top-p"),
        (&["--min-p=-0.1"][..], "min-p"),
        (&["--min-p", "2"][..], "min-p"),
        (&["--temperature=-1"][..], "temperature"),
        (&["--temperature", "NaN"][..], "temperature"),
        (&["--greedy-requests", "9"][..], "greedy requests"),
    ] {
        let o = demo(args);
        let (_, err) = expect_code(&o, 2);
        assert!(error_line(&err).contains(what), "{args:?}: {err}");
    }
}
