//! One decode step of a serving engine in vLLM's ragged layout on the CPU backend: three
//! requests with 3, 2 and 0 draft tokens (the last had no draft this step: only its bonus token
//! is sampled, and it is not counted as a draft), `num_tokens + B` target rows indexed by the
//! cumulative draft counts, outputs converted to vLLM's `-1`-padded `[B, k_max+1]` i32 layout,
//! and the random offsets advanced for the next step. Then the same step from target **logits**
//! with a temperature per request: request 0 sampled at T = 0.7 with draft probabilities
//! (rejection sampling), request 1 greedy (T = 0, an n-gram drafter: one-hot draft rows),
//! request 2 again without draft — one batch, one call.
//!
//! `cargo run -p specula --example ragged_step`

use specula::cpu::CpuVerifier;
use specula::specula_core::verify::{
    Batch, Check, Logits, Method, Outputs, RaggedDrafts, Streams, advance_offsets, to_vllm_tokens,
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
        let width = batch.k_max + 1;
        let mut accepted = [0u32; 3];
        let mut tokens = vec![0u32; 3 * width];
        let mut out = Outputs {
            accepted: &mut accepted,
            tokens: &mut tokens,
        };
        verifier.verify(Method::Greedy, Check::STRICT, &batch, &mut out)?;
        let mut vllm = vec![0i32; 3 * width];
        to_vllm_tokens(&tokens, &mut vllm)?;
        println!("step {step}: accepted {accepted:?}, output_token_ids {vllm:?}");
        // Greedy: request 0 accepts 1, 2, rejects 3 (argmax 6); request 1 accepts 4, 5 and
        // gets the bonus 7; request 2 only has its bonus, 3.
        assert_eq!(vllm, [1, 2, 6, -1, 4, 5, 7, -1, 3, -1, -1, -1]);
        advance_offsets(&mut offset);
    }
    // Requests 0 and 1 were counted (twice); request 2 had no draft and is not.
    let c = verifier.totals();
    assert_eq!((c.drafts, c.draft_tokens, c.accepted_tokens), (4, 10, 8));
    println!("drafts {}, accepted {}", c.drafts, c.accepted_tokens);

    // The same layout from logits: row v of `rows` as logits 3·p (any scale would do).
    let logits: Vec<f32> = target.iter().map(|&p| 3.0 * p).collect();
    let temperature = [0.7f32, 0.0, 1.0];
    // Draft rows (5, one per draft token): request 0's drafter probabilities, request 1's
    // n-gram drafter as one-hot rows.
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
    .with_target_logits(Logits {
        values: &logits,
        temperature: &temperature,
    })
    .with_draft_probs(&draft);
    let width = batch.k_max + 1;
    let mut accepted = [0u32; 3];
    let mut tokens = vec![0u32; 3 * width];
    let mut out = Outputs {
        accepted: &mut accepted,
        tokens: &mut tokens,
    };
    // Rejection sampling for the sampled requests; T = 0 makes request 1 greedy.
    verifier.verify(Method::Rejection, Check::STRICT, &batch, &mut out)?;
    let mut vllm = vec![0i32; 3 * width];
    to_vllm_tokens(&tokens, &mut vllm)?;
    println!("logits step: accepted {accepted:?}, output_token_ids {vllm:?}");
    // Request 1 is greedy on its logits, as in the first step.
    assert_eq!(&vllm[4..8], &[4, 5, 7, -1]);
    assert_eq!(accepted[2], 0);
    Ok(())
}
