//! Tree verification conformance: the CPU backend (1 thread, a pool with more and fewer
//! requests than threads, the reference reductions) gives the core reference's bits, errors
//! and counts on random trees, every method, with and without draft probabilities, with
//! target logits, with garbage values, and at vocabulary sizes users run (probabilities, and
//! logits shaped like models' outputs: peaked, flat, `−∞` masks, exact ties; temperatures 0,
//! 0.8 and others). The CPU kernels' instruction sets are compared one by one in the backend's
//! own tests (`cpu::tree::tests`); here the widest this CPU has runs (`SPECULA_CPU_ISA=avx2` /
//! `portable` select a narrower one for the whole run).

use specula::cpu::CpuVerifier;
use specula_core::verify::tree::verify_tree_batch;
use specula_core::verify::{Check, Method, Tensor, VerifyError};
use specula_core::{Counters, HasKind};
use specula_tests::conformance::{Gen, K, METHODS};
use specula_tests::tree::{TreeData, TreeOut, TreeSpec, assert_well_formed, random_tree_batch};

fn reference(
    method: Method,
    check: Check,
    d: &TreeData,
) -> (Result<(), VerifyError>, TreeOut, Counters<K>) {
    let mut out = TreeOut::new(d.requests(), d.max_depth);
    let mut c = Counters::ZERO;
    let r = verify_tree_batch(method, check, &d.view(), &mut out.view(), &mut c);
    (r, out, c)
}

fn backends() -> Vec<(&'static str, CpuVerifier<K>)> {
    vec![
        ("cpu-1", CpuVerifier::new(1).unwrap()),
        ("cpu-3", CpuVerifier::new(3).unwrap()),
        ("reference", CpuVerifier::reference()),
    ]
}

fn assert_matches(method: Method, check: Check, d: &TreeData, what: &str) {
    let (want, want_out, want_c) = reference(method, check, d);
    if want.is_ok() {
        assert_well_formed(d, &want_out, what);
    }
    for (name, v) in backends() {
        let mut out = TreeOut::new(d.requests(), d.max_depth);
        let got = v.verify_tree(method, check, &d.view(), &mut out.view());
        assert_eq!(got, want, "{what} {name} {method:?}: result");
        assert_eq!(out, want_out, "{what} {name} {method:?}: outputs");
        assert_eq!(v.totals(), want_c, "{what} {name} {method:?}: counters");
    }
}

fn spec(draft: bool, logits: bool, garbage: bool) -> TreeSpec {
    TreeSpec {
        max_requests: 6,
        max_nodes: 12,
        max_depth: 5,
        vocab: 37,
        draft,
        logits,
        garbage,
    }
}

#[test]
fn cpu_matches_reference_on_random_trees() {
    let mut g = Gen(0x7EE5);
    for i in 0..150 {
        let s = spec(g.chance(1, 2), g.chance(1, 4), false);
        let d = random_tree_batch(&mut g, s);
        for m in METHODS {
            assert_matches(m, Check::STRICT, &d, &format!("batch {i} {s:?}"));
        }
    }
}

#[test]
fn cpu_matches_reference_on_garbage_values() {
    let mut g = Gen(0x6A7B);
    for i in 0..100 {
        let s = spec(g.chance(1, 2), false, true);
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
        // The strict check refuses them (unless they fell in padding slots), with the same
        // error everywhere, counting nothing.
        let (r, _, c) = reference(Method::Rejection, Check::STRICT, &d);
        if let Err(e) = r {
            assert!(c.is_zero());
            assert!(matches!(
                e,
                VerifyError::BadProbability { .. } | VerifyError::RowSum { .. }
            ));
            assert_matches(Method::Rejection, Check::STRICT, &d, &format!("strict {i}"));
        }
    }
}

/// Vocabulary sizes users run, with 64-node trees (EAGLE-2's default budget): the chunked,
/// vectorised reductions against the plain loops over many full blocks.
#[test]
fn cpu_matches_reference_at_user_vocabularies() {
    let mut g = Gen(0xB16);
    for (i, &vocab) in [32_000usize, 128_256].iter().enumerate() {
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
                assert_matches(m, Check::Cheap, &d, &format!("V={vocab} draft={draft} {i}"));
            }
        }
    }
}

/// Logits rows of the shapes models give, at the vocabularies users run: the CPU backend
/// reduces each row's softmax with the chain's vectorised kernels, the reference with plain
/// loops; same outputs and counts.
#[test]
fn cpu_matches_reference_on_logits_at_user_vocabularies() {
    let mut g = Gen(0x10_6175);
    let mut accepted = 0;
    for (i, &vocab) in [32_000usize, 128_256].iter().enumerate() {
        for draft in [false, true] {
            let mut d = random_tree_batch(
                &mut g,
                TreeSpec {
                    max_requests: 3,
                    max_nodes: 10,
                    max_depth: 4,
                    vocab,
                    draft,
                    logits: true,
                    garbage: false,
                },
            );
            let temps = d.temperature.as_mut().expect("logits");
            for t in temps.iter_mut() {
                *t = [0.0, 0.8, 0.8, 1.3][g.below(4)];
            }
            for b in 0..d.requests() {
                let parents = d.parents(b);
                let base = b * d.max_nodes;
                for u in 0..parents.len() {
                    let row = &mut d.target[(base + u) * vocab..][..vocab];
                    shaped_logits(&mut g, row);
                }
                // Children on the parent's argmax half the time: accepted paths.
                for (c, &p) in parents.iter().enumerate().skip(1) {
                    if g.chance(1, 2) {
                        let row = &d.target[(base + p as usize) * vocab..][..vocab];
                        d.tokens[base + c] = specula_core::verify::argmax(row);
                    }
                }
            }
            for m in METHODS {
                assert_matches(
                    m,
                    Check::Cheap,
                    &d,
                    &format!("logits V={vocab} draft={draft} {i}"),
                );
            }
            let (r, out, _) = reference(Method::Greedy, Check::Cheap, &d);
            r.unwrap();
            accepted += out.accepted.iter().sum::<u32>();
        }
    }
    // The inputs reach past the root (the reductions of accepted rows are compared too).
    assert!(accepted > 0);
}

/// A logits row of a random shape: peaked like a language model's output (one id with p ≈ 0.7
/// at T = 0.8 over a `2·N(0, 1)` background at V = 128256), flat (`3·ln u`), peaked with most
/// ids masked (`−∞`), or few distinct values (exact ties, the largest shared).
fn shaped_logits(g: &mut Gen, row: &mut [f32]) {
    let v = row.len();
    match g.below(4) {
        0 | 2 => {
            for x in row.iter_mut() {
                // A normal draw (Box–Muller).
                let (u, w) = (f64::from(g.unit()) + 1e-9, f64::from(g.unit()));
                *x = 2.0 * ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * w).cos()) as f32;
            }
            row[g.below(v)] = 19.0;
            if g.chance(1, 2) {
                for x in row.iter_mut() {
                    if g.chance(3, 4) {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
        }
        1 => row
            .iter_mut()
            .for_each(|x| *x = 3.0 * (g.unit() + 1e-6).ln()),
        _ => row.iter_mut().for_each(|x| *x = g.below(4) as f32 * 0.5),
    }
}

#[test]
fn malformed_trees_are_refused_alike_and_count_nothing() {
    let mut g = Gen(0xBAD);
    let base = random_tree_batch(&mut g, spec(true, false, false));
    let b = base.requests() - 1;
    let slot = b * base.max_nodes;
    let n = base.nodes[b] as usize;
    type Case = (&'static str, TreeData, fn(&VerifyError) -> bool);
    let mut cases: Vec<Case> = Vec::new();
    let mut d = base.clone();
    d.nodes[b] = base.max_nodes as u32 + 1;
    cases.push(("node count", d, |e| {
        matches!(e, VerifyError::NodeCount { .. })
    }));
    let mut d = base.clone();
    d.first_child[slot] = n as i32;
    cases.push(("link", d, |e| {
        matches!(e, VerifyError::LinkOutOfRange { .. })
    }));
    if n >= 2 {
        let mut d = base.clone();
        // The last node of a path points back at the first child of the root: a cycle.
        let mut u = 0usize;
        while d.first_child[slot + u] >= 0 {
            u = d.first_child[slot + u] as usize;
        }
        d.first_child[slot + u] = d.first_child[slot];
        cases.push(("cycle", d, |e| matches!(e, VerifyError::Cycle { .. })));
        let mut d = base.clone();
        d.tokens[slot + 1] = d.vocab as u32;
        cases.push(("token", d, |e| {
            matches!(e, VerifyError::TokenOutOfRange { .. })
        }));
    }
    let mut d = base.clone();
    d.max_depth = K + 1;
    cases.push(("depth above K", d, |e| {
        matches!(e, VerifyError::MaxDepthOutOfRange { max: K, .. })
    }));
    let mut d = base.clone();
    d.target.pop();
    cases.push(("length", d, |e| matches!(e, VerifyError::Length { .. })));
    let mut d = base.clone();
    if let Some(dr) = &mut d.draft {
        dr[slot * d.vocab + d.vocab] = f32::NAN; // node 1's draft row
    }
    if n >= 2 {
        cases.push(("probability", d, |e| {
            matches!(
                e,
                VerifyError::BadProbability {
                    tensor: Tensor::Draft,
                    ..
                }
            )
        }));
    }
    for (what, d, ok) in cases {
        let (r, _, c) = reference(Method::Rejection, Check::STRICT, &d);
        let e = r.expect_err(what);
        assert!(ok(&e), "{what}: {e:?}");
        assert!(c.is_zero(), "{what}");
        assert_eq!(e.kind(), specula_core::ErrorKind::InvalidInput);
        for (name, v) in backends() {
            let mut out = TreeOut::new(d.requests(), d.max_depth.min(K));
            let untouched = out.clone();
            let got = v.verify_tree(Method::Rejection, Check::STRICT, &d.view(), &mut out.view());
            assert_eq!(got, Err(e), "{what} {name}");
            assert_eq!(out, untouched, "{what} {name}: outputs untouched");
            assert!(v.totals().is_zero(), "{what} {name}: nothing counted");
        }
    }
}

/// Greedy on a one-hot target follows exactly the target's tokens: the accepted path is the
/// longest one whose tokens are the argmax chain.
#[test]
fn greedy_follows_the_argmax_through_the_tree() {
    let mut g = Gen(0x6EED);
    for i in 0..200 {
        let mut d = random_tree_batch(&mut g, spec(false, false, false));
        let v = d.vocab;
        // One-hot targets pointing at a random child's token (or a random token).
        for b in 0..d.requests() {
            let parents = d.parents(b);
            let n = parents.len();
            for u in 0..n {
                let kids: Vec<usize> = (1..n).filter(|&c| parents[c] == u as i32).collect();
                let t = if !kids.is_empty() && g.chance(3, 4) {
                    d.tokens[b * d.max_nodes + kids[g.below(kids.len())]] as usize
                } else {
                    g.below(v)
                };
                let row = &mut d.target[(b * d.max_nodes + u) * v..][..v];
                row.fill(0.0);
                row[t] = 1.0;
            }
        }
        let (r, out, _) = reference(Method::Greedy, Check::STRICT, &d);
        r.unwrap();
        for b in 0..d.requests() {
            // Walk it independently: at each node the first child (sibling order) whose token
            // is the row's hot id.
            let parents = d.parents(b);
            let mut u = 0usize;
            let mut want = vec![];
            loop {
                let row = &d.target[(b * d.max_nodes + u) * v..][..v];
                let hot = row.iter().position(|&x| x == 1.0).unwrap() as u32;
                let mut c = d.first_child[b * d.max_nodes + u];
                let mut next = None;
                while c >= 0 {
                    if d.tokens[b * d.max_nodes + c as usize] == hot {
                        next = Some(c as usize);
                        break;
                    }
                    c = d.next_sibling[b * d.max_nodes + c as usize];
                }
                want.push(hot);
                match next {
                    Some(c) => {
                        assert_eq!(parents[c], u as i32);
                        u = c;
                    }
                    None => break,
                }
            }
            let w = d.max_depth + 1;
            assert_eq!(out.accepted[b] as usize, want.len() - 1, "batch {i}");
            assert_eq!(&out.tokens[b * w..][..want.len()], &want[..], "batch {i}");
        }
        assert_matches(Method::Greedy, Check::STRICT, &d, &format!("one-hot {i}"));
    }
}
