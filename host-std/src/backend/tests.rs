use super::*;
use specula_core::verify::tree::PathOut;
use specula_core::verify::{AcceptedOut, Dims, Drafts, Streams, TokensOut};

#[test]
fn trees_verify_and_count_on_the_cpu_and_the_reference_alike() {
    use specula_core::verify::tree::{Tree, TreeDims, verify_tree_batch};
    // Root with candidates 1 and 0 (V = 2); node 1 has a child, token 1.
    let target = [0.1, 0.9, 0.5, 0.5, 1.0, 0.0, 0.3, 0.7];
    let batch = TreeBatch::new(
        TreeDims {
            vocab: 2,
            max_nodes: 4,
            max_depth: 2,
        },
        Tree {
            nodes: &[4],
            tokens: &[0, 1, 0, 1],
            first_child: &[1, 3, -1, -1],
            next_sibling: &[-1, 2, -1, -1],
        },
        &target,
        Streams {
            seed: &[7],
            offset: &[0],
        },
    );
    let mut want = ([0u32; 1], [0u32; 3], [0u32; 3]);
    let mut want_c = Counters::<4>::ZERO;
    verify_tree_batch(
        Method::Rejection,
        Check::STRICT,
        &batch,
        &mut TreeOutputs::new(
            AcceptedOut(&mut want.0),
            PathOut(&mut want.1),
            TokensOut(&mut want.2),
        ),
        &mut want_c,
    )
    .unwrap();
    assert_eq!((want_c.tree_drafts, want_c.tree_draft_tokens), (1, 3));
    for spec in ["cpu:1", "reference"] {
        let mut b = Backend::<4>::open(&spec.parse().unwrap()).unwrap();
        let mut got = ([0u32; 1], [0u32; 3], [0u32; 3]);
        b.verify_tree(
            Method::Rejection,
            Check::STRICT,
            &batch,
            &mut TreeOutputs::new(
                AcceptedOut(&mut got.0),
                PathOut(&mut got.1),
                TokensOut(&mut got.2),
            ),
        )
        .unwrap();
        assert_eq!(got, want, "{spec}");
        assert_eq!(b.totals().unwrap(), want_c, "{spec}");
        // A refused tree: a typed error of the caller's input, nothing counted.
        let bad = TreeBatch::new(
            TreeDims {
                vocab: 2,
                max_nodes: 4,
                max_depth: 1,
            },
            batch.tree,
            &target,
            Streams {
                seed: batch.seed,
                offset: batch.offset,
            },
        );
        let e = b
            .verify_tree(
                Method::Rejection,
                Check::STRICT,
                &bad,
                &mut TreeOutputs::new(
                    AcceptedOut(&mut got.0),
                    PathOut(&mut got.1[..2]),
                    TokensOut(&mut got.2[..2]),
                ),
            )
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{spec}: {e}");
        assert_eq!(b.totals().unwrap(), want_c, "{spec}: nothing counted");
    }
}

#[test]
fn specs_parse_and_print() {
    for (text, kind, index) in [
        ("cpu", BackendKind::Cpu, None),
        ("cpu:4", BackendKind::Cpu, Some(4)),
        ("CUDA:1", BackendKind::Cuda, Some(1)),
        ("rocm", BackendKind::Rocm, None),
        ("reference", BackendKind::Reference, None),
    ] {
        let s: BackendSpec = text.parse().unwrap();
        assert_eq!((s.kind, s.index), (kind, index), "{text}");
        assert_eq!(s.to_string(), text.to_ascii_lowercase());
    }
    for bad in ["gpu", "cuda:x", "cuda:-1", "reference:2", ""] {
        let e = bad.parse::<BackendSpec>().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{bad}");
    }
}

#[test]
fn a_backend_not_compiled_in_is_a_typed_error() {
    for kind in BackendKind::ALL {
        if kind.compiled_in() {
            continue;
        }
        let e = Backend::<4>::open(&BackendSpec::new(kind)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotCompiledIn);
        assert!(e.kind().is_unavailable());
        assert_eq!(e.backend(), Some(kind));
        assert!(e.to_string().contains(kind.feature().unwrap()), "{e}");
    }
}

#[test]
fn gpu_backends_without_a_gpu_are_unavailable_not_panics() {
    // No GPU on CI: a compiled-in GPU backend reports a missing driver, device or compiler.
    for kind in [BackendKind::Cuda, BackendKind::Rocm] {
        match Backend::<4>::open(&BackendSpec::new(kind)) {
            Ok(b) => assert_eq!(b.kind(), kind), // a machine with a GPU
            Err(e) => assert!(e.kind().is_unavailable(), "{kind}: {e}"),
        }
    }
}

#[test]
fn cpu_and_reference_agree_and_count_through_their_readbacks() {
    let target = [
        0.1f32, 0.5, 0.2, 0.2, /* position 1 */ 0.3, 0.3, 0.2, 0.2, /* bonus */ 0.25,
        0.25, 0.25, 0.25,
    ];
    let batch = Batch::dense(
        Dims { vocab: 4, k_max: 2 },
        Drafts {
            k: &[2],
            ids: &[1, 0],
        },
        &target,
        Streams {
            seed: &[11],
            offset: &[5],
        },
    );
    let mut results = Vec::new();
    for name in ["cpu:2", "reference"] {
        let mut b = Backend::<4>::open(&name.parse().unwrap()).unwrap();
        let mut r = b.readback().unwrap();
        let (mut a, mut t) = ([0u32; 1], [0u32; 3]);
        let mut out = Outputs::new(
            specula_core::verify::AcceptedOut(&mut a),
            specula_core::verify::TokensOut(&mut t),
        );
        b.verify(Method::Rejection, Check::Cheap, &batch, &mut out)
            .unwrap();
        let flushed = r.flush().unwrap();
        assert_eq!(flushed.drafts, 1, "{name}");
        assert_eq!(flushed.accepted_tokens, u64::from(a[0]), "{name}");
        assert_eq!(b.totals().unwrap(), flushed);
        results.push((a, t));
    }
    assert_eq!(
        results[0], results[1],
        "CPU and reference give the same bits"
    );
    // A refused batch keeps its validation error and kind.
    let mut b = Backend::<4>::open(&"cpu".parse().unwrap()).unwrap();
    let bad = Batch::dense(
        Dims { vocab: 4, k_max: 2 },
        Drafts {
            k: &[2],
            ids: &[9, 0],
        },
        &target,
        Streams {
            seed: &[11],
            offset: &[5],
        },
    );
    let (mut a, mut t) = ([0u32; 1], [0u32; 3]);
    let e = b
        .verify(
            Method::Greedy,
            Check::Cheap,
            &bad,
            &mut Outputs::new(
                specula_core::verify::AcceptedOut(&mut a),
                specula_core::verify::TokensOut(&mut t),
            ),
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert_eq!(e.backend(), Some(BackendKind::Cpu));
    assert!(e.verify_error().is_some());
}

/// The recovered-token output goes through `Backend::verify` to the CPU backend and the
/// reference: the same tokens as the separate `recovered_tokens` call, every method; a
/// wrong length is the typed error with its kind, nothing written.
#[test]
fn recovered_tokens_come_back_from_the_verify_call() {
    use specula_core::verify::{Param, recovered_tokens};
    // V = 4, k_max = 2; request 0 drafts [1, 0], request 1 drafts [3].
    let mut target = Vec::new();
    for i in 0..6 {
        let hot = (i * 3 + 1) % 4;
        target.extend((0..4).map(|v| if v == hot { 0.7 } else { 0.1 }));
    }
    let batch = Batch::dense(
        Dims { vocab: 4, k_max: 2 },
        Drafts {
            k: &[2, 1],
            ids: &[1, 0, 3, 0],
        },
        &target,
        Streams {
            seed: &[11, 12],
            offset: &[5, 0],
        },
    );
    for method in [Method::Rejection, Method::Greedy, Method::Typical] {
        let mut want = [0u32; 4];
        recovered_tokens::<4>(method, Check::STRICT, &batch, &mut want).unwrap();
        assert_eq!(want[3], specula_core::verify::SENTINEL);
        for name in ["cpu:2", "cpu", "reference"] {
            let mut b = Backend::<4>::open(&name.parse().unwrap()).unwrap();
            assert!(Verifier::<4>::support(&b).recovered, "{name}");
            let (mut a, mut t, mut rec) = ([0u32; 2], [0u32; 6], [9u32; 4]);
            let mut out =
                Outputs::new(AcceptedOut(&mut a), TokensOut(&mut t)).with_recovered(&mut rec);
            b.verify(method, Check::STRICT, &batch, &mut out).unwrap();
            assert_eq!(rec, want, "{name} {method:?}");
            let mut short = [9u32; 3];
            let (mut a, mut t) = ([0u32; 2], [0u32; 6]);
            let e = b
                .verify(
                    method,
                    Check::STRICT,
                    &batch,
                    &mut Outputs::new(AcceptedOut(&mut a), TokensOut(&mut t))
                        .with_recovered(&mut short),
                )
                .unwrap_err();
            assert_eq!(
                e.verify_error(),
                Some(&VerifyError::Length {
                    param: Param::Recovered,
                    len: 3,
                    expected: 4
                })
            );
            assert_eq!(e.kind(), ErrorKind::InvalidInput);
            assert_eq!((a, t, short), ([0; 2], [0; 6], [9; 3]), "{name}");
        }
    }
}

#[test]
fn open_or_falls_back_only_where_the_first_backend_cannot_run() {
    let spec = |kind| BackendSpec { kind, index: None };
    let cpu = BackendSpec {
        kind: BackendKind::Cpu,
        index: Some(1),
    };
    for gpu in [BackendKind::Cuda, BackendKind::Rocm] {
        match Backend::<4>::open(&spec(gpu)) {
            // No driver, device or compiler here (or not compiled in): the fallback opens.
            Err(e) if e.kind().is_unavailable() => {
                let b = Backend::<4>::open_or(&spec(gpu), &cpu).expect("the CPU opens");
                assert_eq!(b.kind(), BackendKind::Cpu);
            }
            // A GPU here: it is the one opened.
            Ok(_) => {
                let b = Backend::<4>::open_or(&spec(gpu), &cpu).expect("it opened before");
                assert_eq!(b.kind(), gpu);
            }
            Err(e) => panic!("{gpu}: {e}"),
        }
    }
    // Both unavailable: the fallback's own error, not the first one's.
    let (cuda, rocm) = (
        Backend::<4>::open(&spec(BackendKind::Cuda)),
        Backend::<4>::open(&spec(BackendKind::Rocm)),
    );
    if matches!((&cuda, &rocm), (Err(a), Err(b))
        if a.kind().is_unavailable() && b.kind().is_unavailable())
    {
        let e = Backend::<4>::open_or(&spec(BackendKind::Cuda), &spec(BackendKind::Rocm))
            .expect_err("neither can run");
        assert_eq!(e.backend(), Some(BackendKind::Rocm), "{e}");
    }
}
