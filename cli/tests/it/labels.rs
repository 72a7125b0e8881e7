//! `--label` and `--model-name`: a bad constant label exits 2 before the run.

use crate::support::{demo, error_line, expect_code};

#[test]
fn bad_labels_exit_2_before_the_run() {
    for (args, want) in [
        (
            vec!["--label", "bad-name=x"],
            "must match [a-zA-Z_][a-zA-Z0-9_]*",
        ),
        (vec!["--label", "__x=1"], "must match"),
        (vec!["--label", "engine=x"], "reserved"),
        (vec!["--label", "instance=x"], "reserved"),
        (vec!["--label", "model_name=x"], "given twice"),
        (vec!["--label", "a=1", "--label", "a=2"], "given twice"),
        (vec!["--label", "novalue"], "is not NAME=VALUE"),
        (vec!["--label", "region="], "must be 1 to 256 bytes"),
        (vec!["--model-name", ""], "must be 1 to 256 bytes"),
    ] {
        let o = demo(&args);
        let (_, err) = expect_code(&o, 2);
        let line = error_line(&err);
        assert!(line.contains("bad label"), "{args:?}: {line}");
        assert!(line.contains(want), "{args:?}: {line}");
        assert!(
            !err.contains("SpecDecoding"),
            "refused before the run: {err}"
        );
    }
}
