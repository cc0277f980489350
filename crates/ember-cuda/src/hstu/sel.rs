//! Which tokens a pass with a cache of users' histories computes ([`Sel`]), their compact
//! plan, and where the held and kept keys and values are on the device (`cached.rs` runs it).

use cudarc::driver::CudaSlice;
use ember_model::hstu::{ContextualSlot, TokenPlan};

use crate::device::Gpu;
use crate::error::Result;
use crate::model::up;

/// Keys and values of `n` tokens in a device segment (`[layers][n][v | k]` at `ptr`), for the
/// batch's tokens from `row` on.
#[derive(Debug, Clone, Copy)]
pub(super) struct Piece {
    pub ptr: u64,
    pub n: usize,
    pub row: usize,
}

/// Which tokens a cached pass computes, and where its held and kept keys and values are.
#[derive(Debug, Default)]
pub(super) struct Sel {
    /// The computed tokens, ascending: compact row `k` is token `tokens[k]`.
    pub tokens: Vec<usize>,
    /// Per user (sequence): its first computed token, counted from its start.
    pub firsts: Vec<usize>,
    /// Tokens read from segments.
    pub held: Vec<Piece>,
    /// Tokens kept in new segments.
    pub kept: Vec<Piece>,
}

impl Sel {
    /// `plan`'s per-token parts for the computed tokens alone, in compact rows; its sequences,
    /// time features and offsets as they are (the batch's layout, the candidates').
    pub fn compact(&self, plan: TokenPlan, full: usize) -> TokenPlan {
        if self.tokens.len() == full {
            return plan;
        }
        let mut at = vec![usize::MAX; full];
        for (k, &t) in self.tokens.iter().enumerate() {
            at[t] = k;
        }
        let aw = plan.action_width;
        let pick = |v: &[u32]| self.tokens.iter().map(|&t| v[t]).collect::<Vec<u32>>();
        TokenPlan {
            positions: pick(&plan.positions),
            buckets: pick(&plan.buckets),
            action_width: aw,
            actions: match aw {
                0 => Vec::new(),
                _ => (self.tokens.iter())
                    .flat_map(|&t| plan.actions[t * aw..(t + 1) * aw].iter().copied())
                    .collect(),
            },
            contextual: (plan.contextual.iter())
                .filter(|c| at[c.token] != usize::MAX)
                .map(|c| ContextualSlot {
                    token: at[c.token],
                    ..*c
                })
                .collect(),
            // A user's candidates are its last tokens: always computed.
            candidate_rows: plan.candidate_rows.iter().map(|&r| at[r]).collect(),
            seqs: plan.seqs,
            time_features: plan.time_features,
            offsets: plan.offsets,
        }
    }

    /// `pieces` on the device: (their segments' addresses, their `(n, row)` pairs, how many).
    pub fn upload_pieces(
        gpu: &Gpu,
        pieces: &[Piece],
        segs: &mut Option<CudaSlice<u64>>,
        meta: &mut Option<CudaSlice<i32>>,
    ) -> Result<(u64, u64, usize)> {
        if pieces.is_empty() {
            return Ok((0, 0, 0));
        }
        let ptrs: Vec<u64> = pieces.iter().map(|p| p.ptr).collect();
        let pairs: Vec<i32> = (pieces.iter())
            .flat_map(|p| [p.n as i32, p.row as i32])
            .collect();
        let a = up(gpu, segs, &ptrs, "uploading the segments' addresses")?;
        let b = up(gpu, meta, &pairs, "uploading the segments' tokens")?;
        Ok((a, b, pieces.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_embed::DType;
    use ember_model::hstu::presets::{preset, synthetic_users};
    use ember_model::hstu::{AttentionNorm, HstuModel};

    /// A batch's compact plan holds the full plan's rows of the computed tokens, in their
    /// order, its contextual slots and candidates pointing at the same tokens; the sequences,
    /// time features and offsets unchanged; with every token computed, the plan itself.
    #[test]
    fn a_compact_plan_is_the_full_plan_s_rows_of_the_computed_tokens() {
        for name in ["hstu-small", "dlrm-v3"] {
            let cfg = preset(name, 1e-5, DType::F32).unwrap();
            let m = HstuModel::random(cfg, 3, 1).unwrap();
            let mut users = Vec::new();
            for (h, c) in [(50, 7), (33, 1), (90, 12), (5, 3)] {
                users.extend(synthetic_users(m.config(), 1, h, c, h as u64));
            }
            let b = m.check_users(&users, 0).unwrap();
            let full = m.token_plan(&b, AttentionNorm::Alone);
            let slots = b.slots();
            // Whole, from its 20th token, only its last history item and candidates, whole.
            let firsts = [0, 20, slots + 89, 0];
            let mut sel = Sel::default();
            for (span, &f) in b.users().iter().zip(&firsts) {
                sel.firsts.push(f);
                sel.tokens
                    .extend(span.start + f..span.start + b.len_of(span));
            }
            let c = sel.compact(full.clone(), b.tokens());
            let n = sel.tokens.len();
            assert!(n < b.tokens(), "{name}: some tokens held");
            assert_eq!((c.positions.len(), c.buckets.len()), (n, n), "{name}");
            let aw = full.action_width;
            assert_eq!(c.actions.len(), n * aw, "{name}");
            for (k, &t) in sel.tokens.iter().enumerate() {
                assert_eq!(c.positions[k], full.positions[t], "{name}: token {t}");
                assert_eq!(c.buckets[k], full.buckets[t], "{name}: token {t}");
                assert_eq!(
                    c.actions[k * aw..(k + 1) * aw],
                    full.actions[t * aw..(t + 1) * aw],
                    "{name}: token {t}"
                );
            }
            let computed: Vec<_> = (full.contextual.iter())
                .filter(|s| sel.tokens.contains(&s.token))
                .collect();
            assert_eq!(c.contextual.len(), computed.len(), "{name}");
            // Users 1 and 2 hold their slots; users 0 and 3 compute theirs.
            assert!(
                computed.len() < full.contextual.len() && !computed.is_empty(),
                "{name}"
            );
            assert!(aw > 0, "{name}: an action encoder");
            for (s, f) in c.contextual.iter().zip(computed) {
                assert_eq!(
                    (sel.tokens[s.token], s.slot, s.col),
                    (f.token, f.slot, f.col)
                );
            }
            assert_eq!(c.candidate_rows.len(), full.candidate_rows.len(), "{name}");
            for (&r, &f) in c.candidate_rows.iter().zip(&full.candidate_rows) {
                assert_eq!(sel.tokens[r], f, "{name}: a candidate");
            }
            assert_eq!(
                (&c.seqs, &c.time_features, &c.offsets),
                (&full.seqs, &full.time_features, &full.offsets),
                "{name}"
            );
            let all = Sel {
                tokens: (0..b.tokens()).collect(),
                firsts: vec![0; b.len()],
                ..Sel::default()
            };
            assert_eq!(all.compact(full.clone(), b.tokens()), full, "{name}");
        }
    }
}
