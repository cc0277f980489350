//! One user's entry in the cache of histories: its held tokens' keys and values, in segments
//! each computed by one request (`cache.rs` keeps entries, `spill.rs` writes them to disk).

use std::sync::Arc;

use super::plan::AsOf;

/// Tokens of one user computed at one request: every layer's keys and values.
#[derive(Debug)]
pub struct Segment {
    /// Tokens held.
    pub tokens: usize,
    /// The request that computed them.
    pub as_of: AsOf,
    /// `[layers][tokens][v (H x hid) | k (H x qk)]`.
    pub kv: Vec<f32>,
}

impl Segment {
    fn bytes(&self) -> usize {
        self.kv.len() * 4 + std::mem::size_of::<Segment>()
    }
}

/// One user's held tokens: its contextual slots and first `history` history items.
#[derive(Debug, Clone)]
pub struct Entry {
    /// History items held (the slots come first).
    pub history: usize,
    /// Every input of the held tokens ([`super::cache::fingerprint`]).
    pub fingerprint: u64,
    /// Per table of the model: its update epoch when the entry's newest segment was computed
    /// ([`ember_embed::UpdateLog`]); a held token's row written since retires the entry.
    pub epochs: Vec<u64>,
    pub segments: Vec<Arc<Segment>>,
}

impl Entry {
    /// Bytes it holds.
    pub fn bytes(&self) -> usize {
        self.segments.iter().map(|s| s.bytes()).sum::<usize>() + std::mem::size_of::<Entry>()
    }

    /// Tokens it holds (slots and history items).
    pub fn tokens(&self) -> usize {
        self.segments.iter().map(|s| s.tokens).sum()
    }

    /// Whether it holds its `slots` and history whole: some segment, every segment's values
    /// there (`per_token`: layers x values per token), adding up to its tokens.
    pub(crate) fn is_whole(&self, slots: usize, per_token: usize) -> bool {
        !self.segments.is_empty()
            && self.tokens() == slots + self.history
            && (self.segments.iter()).all(|s| s.kv.len() == s.tokens * per_token)
    }
}

/// Entries for the tests of the cache and its tiers.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    /// An entry of segments `(tokens, its request's history, scale)`, each with `width` values
    /// a token (value `i` is `i * scale`) and its request's query time `query0 + history`; the
    /// entry holds the last segment's history, fingerprint `0xfeed`, epochs `[0, 4]`.
    pub fn entry(segments: &[(usize, usize, f32)], width: usize, query0: i64) -> Entry {
        let seg = |&(tokens, history, k): &(usize, usize, f32)| {
            Arc::new(Segment {
                tokens,
                as_of: AsOf {
                    history,
                    candidates: 3,
                    query: query0 + history as i64,
                },
                kv: (0..tokens * width).map(|i| i as f32 * k).collect(),
            })
        };
        Entry {
            history: segments.last().map_or(0, |s| s.1),
            fingerprint: 0xfeed,
            epochs: vec![0, 4],
            segments: segments.iter().map(seg).collect(),
        }
    }
}
