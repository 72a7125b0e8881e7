//! The tree kernel text (`core/kernels/specula_tree.cu`, entry `specula_verify_tree`) executed
//! on the host in both macro forms (CUDA: warp 32, HIP: wave 64) gives the core reference's
//! bits and counts on the tree conformance cases (random trees, every method, with and without
//! draft rows, garbage values, 64-node trees at V = 32k and 128k), and on the raw device path
//! sets its error bits for malformed trees, skipping only those requests. Target logits (per
//! request temperature, 0 greedy) give the reference's bits too (issue 14).

use specula_core::Counters;
use specula_core::gpu::kernels::{ERR_TOKEN, ERR_TREE};
use specula_core::verify::tree::verify_tree_batch;
use specula_core::verify::{Check, Method, SENTINEL};
use specula_tests::conformance::{Gen, K, METHODS};
use specula_tests::kernel_host::{KernelHost, Mode};
use specula_tests::tree::{TreeData, TreeOut, TreeSpec, random_tree_batch};

fn reference(method: Method, check: Check, d: &TreeData) -> (TreeOut, Counters<K>) {
    let mut out = TreeOut::new(d.requests(), d.max_depth);
    let mut c = Counters::ZERO;
    verify_tree_batch(method, check, &d.view(), &mut out.view(), &mut c).unwrap();
    (out, c)
}

/// Both macro forms, two block sizes each (one warp / several warps).
fn hosts() -> Vec<KernelHost<K>> {
    vec![
        KernelHost::new(Mode::Cuda, 32).unwrap(),
        KernelHost::new(Mode::Cuda, 128).unwrap(),
        KernelHost::new(Mode::Hip, 64).unwrap(),
        KernelHost::new(Mode::Hip, 128).unwrap(),
    ]
}

fn assert_matches(method: Method, check: Check, d: &TreeData, what: &str) {
    let (want, want_c) = reference(method, check, d);
    for mut h in hosts() {
        let mut out = TreeOut::new(d.requests(), d.max_depth);
        h.verify_tree(method, check, d, &mut out)
            .unwrap_or_else(|e| panic!("{what} {:?} {method:?}: {e:?}", h.mode()));
        assert_eq!(out, want, "{what} {:?} {method:?}: outputs", h.mode());
        assert_eq!(
            specula_core::verify::Verifier::totals(&mut h).unwrap(),
            want_c,
            "{what} {:?} {method:?}: counters",
            h.mode()
        );
    }
}

fn spec(draft: bool, garbage: bool) -> TreeSpec {
    TreeSpec {
        max_requests: 6,
        max_nodes: 12,
        max_depth: 5,
        vocab: 37,
        draft,
        logits: false,
        garbage,
    }
}

#[test]
fn tree_kernel_matches_reference_on_random_trees() {
    let mut g = Gen(0x7EE5);
    for i in 0..60 {
        let s = spec(g.chance(1, 2), false);
        let d = random_tree_batch(&mut g, s);
        for m in METHODS {
            assert_matches(m, Check::STRICT, &d, &format!("batch {i} {s:?}"));
        }
    }
}

#[test]
fn tree_kernel_matches_reference_on_garbage_values() {
    let mut g = Gen(0x6A7B);
    for i in 0..40 {
        let s = spec(g.chance(1, 2), true);
        let mut d = random_tree_batch(&mut g, s);
        // Garbage at the tried tokens themselves (the residual subtracts 1 there).
        for b in 0..d.requests() {
            let base = b * d.max_nodes;
            let mut c = d.first_child[base];
            while c >= 0 {
                let t = d.tokens[base + c as usize] as usize;
                if g.chance(1, 2) {
                    d.target[base * d.vocab + t] = [3.0, f32::NAN, 1.0, 1.5, -1.0][g.below(5)];
                }
                c = d.next_sibling[base + c as usize];
            }
        }
        for m in METHODS {
            assert_matches(m, Check::Cheap, &d, &format!("garbage batch {i}"));
        }
    }
}

/// Wide trees (many siblings per node): the target-only rule's multi-token residual and
/// SpecInfer's Z passes run at every level.
#[test]
fn tree_kernel_matches_reference_on_wide_trees() {
    let mut g = Gen(0x51B5);
    for i in 0..30 {
        let s = TreeSpec {
            max_requests: 3,
            max_nodes: 24,
            max_depth: 2,
            vocab: 11, // few tokens: duplicate sibling tokens are common
            draft: g.chance(1, 2),
            logits: false,
            garbage: false,
        };
        let d = random_tree_batch(&mut g, s);
        assert_matches(Method::Rejection, Check::STRICT, &d, &format!("wide {i}"));
    }
}

/// Vocabulary sizes users run, with 64-node trees (EAGLE-2's default budget).
#[test]
fn tree_kernel_matches_reference_at_user_vocabularies() {
    let mut g = Gen(0xB16);
    for &vocab in &[32_000usize, 128_256] {
        for draft in [false, true] {
            let d = random_tree_batch(
                &mut g,
                TreeSpec {
                    max_requests: 2,
                    max_nodes: 64,
                    max_depth: 7,
                    vocab,
                    draft,
                    logits: false,
                    garbage: false,
                },
            );
            for m in METHODS {
                assert_matches(m, Check::Cheap, &d, &format!("V={vocab} draft={draft}"));
            }
        }
    }
}

/// The raw device path: a malformed request sets its error bit, gets sentinel outputs and is
/// not counted; the other requests are verified as the reference verifies them alone.
#[test]
fn tree_kernel_flags_malformed_trees_and_skips_only_them() {
    let mut g = Gen(0xBAD);
    let mut tried = 0;
    while tried < 12 {
        let base = random_tree_batch(&mut g, spec(false, false));
        let b = base.requests() - 1;
        let slot = b * base.max_nodes;
        let n = base.nodes[b] as usize;
        if n < 2 || base.requests() < 2 {
            continue;
        }
        tried += 1;
        let mut cases: Vec<(&str, TreeData, u64)> = Vec::new();
        let mut d = base.clone();
        d.nodes[b] = base.max_nodes as u32 + 1;
        cases.push(("node count", d, ERR_TREE));
        let mut d = base.clone();
        d.nodes[b] = 0;
        cases.push(("no root", d, ERR_TREE));
        let mut d = base.clone();
        d.first_child[slot] = n as i32;
        cases.push(("link", d, ERR_TREE));
        let mut d = base.clone();
        d.next_sibling[slot] = 1;
        cases.push(("root sibling", d, ERR_TREE));
        let mut d = base.clone();
        let mut u = 0usize;
        while d.first_child[slot + u] >= 0 {
            u = d.first_child[slot + u] as usize;
        }
        d.first_child[slot + u] = d.first_child[slot];
        cases.push(("cycle", d, ERR_TREE));
        let mut d = base.clone();
        d.first_child[slot] = -1;
        cases.push(("unreachable", d, ERR_TREE));
        let mut d = base.clone();
        d.tokens[slot + 1] = d.vocab as u32;
        cases.push(("token", d, ERR_TOKEN));
        // A chain one node deeper than max_depth.
        let mut d = base.clone();
        let len = d.max_depth + 2;
        assert!(len <= d.max_nodes);
        d.nodes[b] = len as u32;
        for i in 0..len {
            d.first_child[slot + i] = if i + 1 < len { (i + 1) as i32 } else { -1 };
            d.next_sibling[slot + i] = -1;
        }
        cases.push(("depth", d, ERR_TREE));
        for (what, d, bit) in cases {
            // The good requests, verified alone by the reference.
            let mut good = d.clone();
            good.nodes.truncate(b);
            let nb = b * d.max_nodes;
            good.tokens.truncate(nb);
            good.first_child.truncate(nb);
            good.next_sibling.truncate(nb);
            good.target.truncate(nb * d.vocab);
            for v in [&mut good.seed, &mut good.offset] {
                v.truncate(b);
            }
            good.eps.truncate(b);
            good.delta.truncate(b);
            let (want, want_c) = reference(Method::Rejection, Check::Cheap, &good);
            let w = d.max_depth + 1;
            for mut h in hosts() {
                let mut out = TreeOut::new(d.requests(), d.max_depth);
                let flags = h.launch_tree(Method::Rejection, &d, &mut out).unwrap();
                assert_eq!(flags, bit, "{what} {:?}", h.mode());
                assert_eq!(out.accepted[b], SENTINEL, "{what}");
                assert!(out.path[b * w..].iter().all(|&x| x == SENTINEL), "{what}");
                assert!(out.tokens[b * w..].iter().all(|&x| x == SENTINEL), "{what}");
                assert_eq!(&out.accepted[..b], &want.accepted[..], "{what}");
                assert_eq!(&out.path[..b * w], &want.path[..], "{what}");
                assert_eq!(&out.tokens[..b * w], &want.tokens[..], "{what}");
                let got = specula_core::verify::Verifier::totals(&mut h).unwrap();
                assert_eq!(got, want_c, "{what} {:?}: only the good requests", h.mode());
            }
        }
    }
}

/// Target logits with a temperature per request (0: greedy on the logits, > 0: the softmax
/// computed on the fly per node row), every method, with and without draft rows; the batches
/// mix temperature 0 and > 0.
#[test]
fn tree_kernel_matches_reference_on_logits_trees() {
    let mut g = Gen(0x1061);
    let mut mixed = 0;
    for i in 0..40 {
        let s = TreeSpec {
            logits: true,
            ..spec(g.chance(1, 2), false)
        };
        let d = random_tree_batch(&mut g, s);
        let t = d.temperature.as_ref().unwrap();
        if t.contains(&0.0) && t.iter().any(|&x| x > 0.0) {
            mixed += 1;
        }
        for m in METHODS {
            assert_matches(m, Check::STRICT, &d, &format!("logits batch {i} {s:?}"));
        }
    }
    assert!(
        mixed >= 5,
        "only {mixed} batches mix greedy and softmax requests"
    );
}

/// Logits at V = 32k with 64-node trees, one greedy (T = 0) and one softmax request per batch.
#[test]
fn tree_kernel_matches_reference_on_logits_at_32k() {
    let mut g = Gen(0x32_1061);
    for draft in [false, true] {
        let mut d = random_tree_batch(
            &mut g,
            TreeSpec {
                max_requests: 1,
                max_nodes: 64,
                max_depth: 7,
                vocab: 32_000,
                draft,
                logits: true,
                garbage: false,
            },
        );
        // Two requests: the first one's tree again, at T = 0 and T = 0.8.
        let twice = |v: &Vec<i32>| [v.clone(), v.clone()].concat();
        d.nodes = vec![d.nodes[0]; 2];
        d.tokens = [d.tokens.clone(), d.tokens.clone()].concat();
        d.first_child = twice(&d.first_child);
        d.next_sibling = twice(&d.next_sibling);
        d.target = [d.target.clone(), d.target.clone()].concat();
        if let Some(x) = &d.draft {
            d.draft = Some([x.clone(), x.clone()].concat());
        }
        d.seed = vec![d.seed[0], d.seed[0] ^ 0x5EED];
        d.offset = vec![d.offset[0]; 2];
        d.eps = vec![d.eps[0]; 2];
        d.delta = vec![d.delta[0]; 2];
        d.temperature = Some(vec![0.0, 0.8]);
        for m in METHODS {
            assert_matches(
                m,
                Check::Cheap,
                &d,
                &format!("logits V=32000 draft={draft}"),
            );
        }
    }
}
