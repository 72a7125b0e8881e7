//! What both tree statistics modules (`tree_stats` on the reference, `gpu_tree_stats` on the
//! GPU path) draw from and test against: the seeded model rows and tree shapes, the chi-square
//! critical values and SpecInfer's exact rank law.

use specula_tests::conformance::Gen;

/// Chi-square critical value at α = 0.001 for `dof` degrees of freedom (Wilson–Hilferty).
pub fn chi2_critical(dof: usize) -> f64 {
    let k = dof as f64;
    let z = 3.090_232; // one-sided normal quantile at 0.001
    let a = 2.0 / (9.0 * k);
    k * (1.0 - a + z * a.sqrt()).powi(3)
}

/// The target's (or drafter's) next-token row after `ctx`: a fixed function of the context,
/// some ids 0, some rows peaked.
pub fn model_row(salt: u64, ctx: &[u32], v: usize) -> Vec<f32> {
    let mut h = salt;
    for &t in ctx {
        h = h
            .wrapping_mul(0x100_0000_01B3)
            .wrapping_add(u64::from(t) + 1);
    }
    let mut g = Gen(h);
    let mut row: Vec<f32> = (0..v)
        .map(|_| if g.chance(1, 6) { 0.0 } else { 0.05 + g.unit() })
        .collect();
    let peak = g.below(v);
    row[peak] += 1.5;
    let s: f32 = row.iter().sum();
    row.iter_mut().for_each(|x| *x /= s);
    row
}

/// The `b` most likely ids of `row` (ties to the lowest id).
pub fn top(row: &[f32], b: usize) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..row.len() as u32).collect();
    ids.sort_by(|&x, &y| row[y as usize].total_cmp(&row[x as usize]).then(x.cmp(&y)));
    ids.truncate(b);
    ids
}

/// A fixed tree shape: `widths[d]` children per node at depth `d`. Returns the parent array.
pub fn shape(widths: &[usize]) -> Vec<i32> {
    let mut parents = vec![-1i32];
    let mut level = vec![0usize];
    for &w in widths {
        let mut next = vec![];
        for &u in &level {
            for _ in 0..w {
                next.push(parents.len());
                parents.push(u as i32);
            }
        }
        level = next;
    }
    parents
}

/// The token path (context) of every node, given the parents and tokens.
pub fn contexts(parents: &[i32], tokens: &[u32]) -> Vec<Vec<u32>> {
    let mut ctx: Vec<Vec<u32>> = vec![vec![]; parents.len()];
    for i in 1..parents.len() {
        // Parents come before their children in `shape`.
        let mut c = ctx[parents[i] as usize].clone();
        c.push(tokens[i]);
        ctx[i] = c;
    }
    ctx
}

/// The exact distribution of the accepted root child's rank under SpecInfer's rule for sibling
/// tokens `xs` drawn from `q` (the same row for every sibling), target `p`: `[rank 0, …, none]`.
pub fn mss_ranks(p: &[f32], q: &[f32], xs: &[usize]) -> Vec<f64> {
    let mut pr: Vec<f64> = p.iter().map(|&x| f64::from(x)).collect();
    let q: Vec<f64> = q.iter().map(|&x| f64::from(x)).collect();
    let mut out = vec![0f64; xs.len() + 1];
    let mut alive = 1.0;
    for (r, &x) in xs.iter().enumerate() {
        let a = if q[x] > 0.0 {
            (pr[x] / q[x]).min(1.0)
        } else {
            1.0
        };
        out[r] = alive * a;
        alive *= 1.0 - a;
        let mut res: Vec<f64> = pr.iter().zip(&q).map(|(p, q)| (p - q).max(0.0)).collect();
        let s: f64 = res.iter().sum();
        if s > 0.0 {
            res.iter_mut().for_each(|x| *x /= s);
        }
        pr = res;
    }
    out[xs.len()] = alive;
    out
}
