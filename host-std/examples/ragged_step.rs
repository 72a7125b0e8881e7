//! One decode step of a serving engine in vLLM's ragged layout on the CPU backend: three
//! requests with 3, 2 and 0 draft tokens (the last had no draft this step: only its bonus token
//! is sampled, and it is not counted as a draft), `num_tokens + B` target rows indexed by the
//! cumulative draft counts, outputs converted to vLLM's `-1`-padded `[B, k_max+1]` i32 layout,
//! and the random offsets advanced for the next step. Then the same step as an engine hands it
//! over (issue 13): **bf16 target logits** in the ragged layout, request 0 sampled at T = 0.7
//! with top-p 0.9 and draft probabilities (k = 3, rejection sampling), request 1 greedy (T = 0,
//! an n-gram drafter: one-hot draft rows, k = 2), request 2 without draft (k = 0) — one batch,
//! one call, no glue — and the outputs in vLLM's layout, with vLLM's `recovered_token_ids`
//! (one per draft token) from the same call.
//!
//! `cargo run -p specula --example ragged_step`

use specula::OutputBuffers;
use specula::cpu::CpuVerifier;
use specula::half::bf16;
use specula::half_tensors;
use specula::specula_core::verify::{
    Batch, Check, Filter, HalfLogits, Method, RaggedDrafts, Streams, advance_offsets,
    to_vllm_recovered, to_vllm_tokens,
};

const V: usize = 8;

/// A probability row peaked at `top` (0.65 there, 0.05 elsewhere).
fn peaked(top: usize) -> [f32; V] {
    let mut r = [0.05f32; V];
    r[top] = 0.65;
    r
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let verifier = CpuVerifier::<4>::new(1)?;
    // vLLM's cu_num_draft_tokens for draft lengths [3, 2, 0], and the 5 draft tokens.
    let cu = [3u32, 5, 5];
    let ids = [1u32, 2, 3, 4, 5];
    // num_tokens + B = 8 target rows: request b's rows start at cu[b−1] + b.
    let rows = [
        peaked(1),
        peaked(2),
        peaked(6),
        peaked(0), // request 0: 3 draft rows + bonus row
        peaked(4),
        peaked(5),
        peaked(7), //            request 1: 2 draft rows + bonus row
        peaked(3), //                                  request 2: its bonus row only
    ];
    let target: Vec<f32> = rows.iter().flatten().copied().collect();
    let seed = [11u64, 22, 33];
    let mut offset = [0u64; 3];
    // Sized from each step's batch, reused across steps.
    let mut out = OutputBuffers::new();
    for step in 0..2 {
        let batch = Batch::ragged(
            V,
            RaggedDrafts {
                cu_num_draft_tokens: &cu,
                ids: &ids,
            },
            &target,
            Streams {
                seed: &seed,
                offset: &offset,
            },
        );
        verifier.verify(Method::Greedy, Check::STRICT, &batch, &mut out.fit(&batch))?;
        let mut vllm = vec![0i32; out.tokens().len()];
        to_vllm_tokens(out.tokens(), &mut vllm)?;
        println!(
            "step {step}: accepted {:?}, output_token_ids {vllm:?}",
            out.accepted()
        );
        // Greedy: request 0 accepts 1, 2, rejects 3 (argmax 6); request 1 accepts 4, 5 and
        // gets the bonus 7; request 2 only has its bonus, 3.
        assert_eq!(vllm, [1, 2, 6, -1, 4, 5, 7, -1, 3, -1, -1, -1]);
        advance_offsets(&mut offset);
    }
    // Requests 0 and 1 were counted (twice); request 2 had no draft and is not.
    let c = verifier.totals();
    assert_eq!((c.drafts, c.draft_tokens, c.accepted_tokens), (4, 10, 8));
    println!("drafts {}, accepted {}", c.drafts, c.accepted_tokens);

    // The same step as the engine hands it over: bf16 target logits in the same ragged layout
    // (`half::bf16`, viewed without a copy), a temperature and a top-p per request.
    // Each row's top id (the peak above) gets logit 4, the next id 1.5, the rest 0.
    let logits: Vec<bf16> = target
        .chunks(V)
        .flat_map(|row| {
            let top = row.iter().position(|&p| p > 0.5).unwrap_or(0);
            (0..V).map(move |v| {
                bf16::from_f32(if v == top {
                    4.0
                } else if v == (top + 1) % V {
                    1.5
                } else {
                    0.0
                })
            })
        })
        .collect();
    // Request 0: T = 0.7, top-p 0.9; request 1: greedy (T = 0); request 2: T = 1, no filter.
    let temperature = [0.7f32, 0.0, 1.0];
    let filters = [Filter::NONE.with_top_p(0.9), Filter::NONE, Filter::NONE];
    // Draft rows (5, one per draft token): request 0's drafter probabilities (k = 3),
    // request 1's n-gram drafter as one-hot rows (k = 2); request 2 has none (k = 0).
    let mut draft = Vec::new();
    for (i, &id) in ids.iter().enumerate() {
        let row = if i < 3 {
            peaked(id as usize)
        } else {
            let mut r = [0.0f32; V];
            r[id as usize] = 1.0;
            r
        };
        draft.extend_from_slice(&row);
    }
    let batch = Batch::ragged(
        V,
        RaggedDrafts {
            cu_num_draft_tokens: &cu,
            ids: &ids,
        },
        &[],
        Streams {
            seed: &seed,
            offset: &offset,
        },
    )
    .with_target_logits_half(HalfLogits {
        values: half_tensors::bf16(&logits),
        temperature: &temperature,
    })
    .with_filters(&filters)
    .with_draft_probs(&draft);
    // With vLLM's recovered_token_ids: one per draft token (ragged: num_tokens = cu[B−1] = 5).
    let mut out = OutputBuffers::new().with_recovered();
    // Rejection sampling for the sampled requests; T = 0 makes request 1 greedy.
    verifier.verify(
        Method::Rejection,
        Check::STRICT,
        &batch,
        &mut out.fit(&batch),
    )?;
    let (accepted, recovered) = (out.accepted(), out.recovered().unwrap_or_default());
    let mut vllm = vec![0i32; out.tokens().len()];
    to_vllm_tokens(out.tokens(), &mut vllm)?;
    let mut vllm_recovered = [0i32; 5];
    to_vllm_recovered(&batch, recovered, &mut vllm_recovered)?;
    println!(
        "bf16 logits step: accepted {accepted:?}, output_token_ids {vllm:?}, \
         recovered_token_ids {vllm_recovered:?}"
    );
    // Request 0: at T = 0.7 the top id has probability ≈ 0.95 ≥ 0.9, so top-p keeps it alone:
    // drafts 1 and 2 are the top ids (accepted), 3 is not (rejected, probability 0 after the
    // filter) and the top id of that row, 6, is emitted — whatever the random draws.
    assert_eq!(&vllm[..4], &[1, 2, 6, -1]);
    // Request 1 is greedy on its logits, as in the first step.
    assert_eq!(&vllm[4..8], &[4, 5, 7, -1]);
    // Request 2: only its bonus token, sampled at T = 1.
    assert_eq!(accepted[2], 0);
    assert!(vllm[8] >= 0 && vllm[9..].iter().all(|&t| t == -1));
    // Recovered, per draft token: request 0's filtered rows are one-hot at their top id, so
    // the residual (target − draft) is positive only there: 1, 2, then 6 (the emitted token at
    // the rejection); request 1 is greedy: each row's argmax, 4 and 5. Request 2 has none.
    assert_eq!(vllm_recovered, [1, 2, 6, 4, 5]);
    advance_offsets(&mut offset);
    Ok(())
}
