//! Sequence features of a graph model (`docs/graph-models.md`): a feature with a `max_len` L
//! (TorchRec's `EmbeddingCollection`) gives its graph each sample's first L rows, unpooled and
//! zero-padded, and the sequence's length.
//!
//! The embedding stage serves it as L pooled features, one per position, each reading the
//! feature's table: position `j` of sample `b` is a bag of the sample's `j`-th id, or an empty bag
//! past its end. A bag of one row pools to that row and an empty bag to zeros, so the pooled
//! output holds the padded sequence, its L rows side by side: `[n, L * dim]` of the graph's
//! `sparse` input is `[n, L, dim]`. Every tier, row update and placement that serves a pooled
//! feature therefore serves a sequence; requests name the feature once, and are spread into
//! positions when checked. The sequence's length (every id the request sent, as TorchRec's
//! `JaggedTensor.lengths()`) goes to the graph as one more column of `dense`, after the dense
//! features, in f32 (exact below 2^24).

use std::ops::Range;

use ember_embed::Ids;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

/// The longest sequence a feature may have (each position is a feature of the embedding stage).
pub use crate::config::MAX_SEQUENCE_LEN as MAX_LEN;

/// How one of the model's features reaches the embedding stage.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Slot {
    /// As itself.
    Pooled,
    /// As `max_len` features, one per position; its length is dense column `column` (counted
    /// from the end of the dense features).
    Sequence { max_len: usize, column: usize },
}

/// A model's features as requests name them, and how each reaches the embedding stage.
#[derive(Debug, Clone, PartialEq)]
pub struct Sequences {
    names: Vec<String>,
    rows: Vec<usize>,
    slots: Vec<Slot>,
    /// Features of the embedding stage.
    expanded: usize,
    /// Sequence features.
    seqs: usize,
}

/// A request's sparse inputs spread over the embedding stage's features.
#[derive(Debug)]
pub(crate) struct Spread {
    /// Per (embedding-stage feature, sample), feature-major.
    pub lengths: Vec<u32>,
    pub ids: Ids,
    /// Per (sample, sequence feature): its length, sample-major.
    pub seq_lengths: Vec<f32>,
}

impl Sequences {
    /// The features of `config` (`None` when none is a sequence), each table's rows given.
    pub fn new(config: &ModelConfig, table_rows: &[usize]) -> Option<Sequences> {
        let feats = config.features();
        if feats.iter().all(|f| f.max_len.is_none()) {
            return None;
        }
        let (mut slots, mut at, mut column) = (Vec::with_capacity(feats.len()), 0, 0);
        for f in &feats {
            slots.push(match f.max_len {
                None => Slot::Pooled,
                Some(max_len) => {
                    column += 1;
                    Slot::Sequence {
                        max_len,
                        column: column - 1,
                    }
                }
            });
            at += f.max_len.unwrap_or(1);
        }
        Some(Sequences {
            names: feats.iter().map(|f| f.name.clone()).collect(),
            rows: table_rows.to_vec(),
            slots,
            expanded: at,
            seqs: column,
        })
    }

    /// The embedding stage's features of `config`: (name, feature of the config it serves),
    /// a sequence feature `f` of length L as `f[0]` .. `f[L-1]`.
    pub fn stage_features(config: &ModelConfig) -> Vec<(String, usize)> {
        let mut out = Vec::new();
        for (i, f) in config.features().iter().enumerate() {
            match f.max_len {
                None => out.push((f.name.clone(), i)),
                Some(l) => out.extend((0..l).map(|j| (format!("{}[{j}]", f.name), i))),
            }
        }
        out
    }

    /// The features' names, as requests give them.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Rows of the table each feature reads.
    pub fn rows(&self) -> &[usize] {
        &self.rows
    }

    /// Sequence features: the columns the graph's `dense` has after the dense features.
    pub fn count(&self) -> usize {
        self.seqs
    }

    /// Spreads `n` samples' sparse inputs (the model's features, feature-major: sample `s` of
    /// feature `f` has `len(f * n + s)` ids) over the embedding stage's features. Refuses what
    /// [`crate::Model::check_samples`] would: a count of lengths or ids that does not add up, an
    /// id out of its table (past a sequence's `max_len` too, as PyTorch's lookup would).
    pub(crate) fn spread(
        &self,
        n: usize,
        len: impl Fn(usize) -> usize,
        ids: &Ids,
    ) -> Result<Spread> {
        let nf = self.names.len();
        let mut sum = 0usize;
        for i in 0..nf * n {
            sum = sum.saturating_add(len(i));
        }
        if sum != ids.len() {
            return Err(ModelError::Input(format!(
                "the lengths add up to {sum} ids but {} ids were sent",
                ids.len()
            )));
        }
        let mut lengths = Vec::with_capacity(self.expanded * n);
        let mut seq_lengths = vec![0f32; n * self.seqs];
        let mut keep = Vec::with_capacity(ids.len());
        let mut at = 0;
        for (f, slot) in self.slots.iter().enumerate() {
            let len_f = |b: usize| len(f * n + b);
            let end = at + (0..n).map(len_f).sum::<usize>();
            match *slot {
                Slot::Pooled => {
                    lengths.extend((0..n).map(|b| len_f(b) as u32));
                    keep.extend(at..end);
                }
                Slot::Sequence { max_len, column } => {
                    // Where each sample's ids start.
                    let starts: Vec<usize> = (0..n)
                        .scan(at, |s, b| {
                            let here = *s;
                            *s += len_f(b);
                            Some(here)
                        })
                        .collect();
                    self.check_ids(f, ids, at..end, &starts)?;
                    for b in 0..n {
                        seq_lengths[b * self.seqs + column] = len_f(b) as f32;
                    }
                    for j in 0..max_len {
                        for (b, &s) in starts.iter().enumerate() {
                            let here = j < len_f(b);
                            lengths.push(u32::from(here));
                            if here {
                                keep.push(s + j);
                            }
                        }
                    }
                }
            }
            at = end;
        }
        let ids = match ids {
            Ids::U32(v) => Ids::U32(keep.iter().map(|&i| v[i]).collect()),
            Ids::I64(v) => Ids::I64(keep.iter().map(|&i| v[i]).collect()),
        };
        Ok(Spread {
            lengths,
            ids,
            seq_lengths,
        })
    }

    /// Every id of sequence feature `f` (ids `range`, sample `b`'s from `starts[b]`) a row of
    /// its table; the first that is not is named with its sample.
    fn check_ids(&self, f: usize, ids: &Ids, range: Range<usize>, starts: &[usize]) -> Result<()> {
        let rows = self.rows[f];
        let Some(p) = ids.first_out_of_range(range.clone(), rows as u64) else {
            return Ok(());
        };
        let i = range.start + p;
        // The last sample starting at or before `i` holds it (empty ones before it share its
        // start).
        let b = starts.partition_point(|&s| s <= i) - 1;
        Err(ModelError::Input(format!(
            "{}: id {} of sample {b} is out of range (the table has {rows} rows)",
            self.names[f],
            ids.get(i)
        )))
    }

    /// `dense` (`[n, dense_in]`) with each sample's sequence lengths after its dense features:
    /// `[n, dense_in + count()]`, what the graph's `dense` input takes.
    pub(crate) fn widen(&self, dense: &[f32], dense_in: usize, seq_lengths: &[f32]) -> Vec<f32> {
        let n = seq_lengths.len().checked_div(self.seqs).unwrap_or(0);
        let mut out = Vec::with_capacity(n * (dense_in + self.seqs));
        for b in 0..n {
            out.extend_from_slice(&dense[b * dense_in..(b + 1) * dense_in]);
            out.extend_from_slice(&seq_lengths[b * self.seqs..(b + 1) * self.seqs]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    /// A graph config of features `(max_len or None)`, each reading its own table of `rows`.
    fn config(feats: &[Option<usize>], rows: usize) -> ModelConfig {
        let tables: Vec<_> = (0..feats.len())
            .map(|i| serde_json::json!({"name": format!("t{i}"), "rows": rows, "dim": 2, "dtype": "f32"}))
            .collect();
        let features: Vec<_> = feats
            .iter()
            .enumerate()
            .map(|(i, l)| match l {
                Some(l) => serde_json::json!({"name": format!("f{i}"), "table": format!("t{i}"), "max_len": l}),
                None => serde_json::json!({"name": format!("f{i}"), "table": format!("t{i}")}),
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "format": "ember-dlrm", "format_version": 1, "family": "graph", "dense_in": 3,
            "interaction": {"kind": "graph", "file": "dense.onnx", "outputs": ["score"]},
            "tables": tables, "features": features,
        }))
        .unwrap()
    }

    /// The spread as its definition says, one bag at a time: (lengths, ids, seq_lengths).
    fn reference(
        feats: &[Option<usize>],
        bags: &[Vec<Vec<i64>>],
    ) -> (Vec<u32>, Vec<i64>, Vec<f32>) {
        let n = bags.first().map_or(0, Vec::len);
        let (mut lengths, mut ids) = (Vec::new(), Vec::new());
        let seqs: Vec<usize> = (0..feats.len()).filter(|&f| feats[f].is_some()).collect();
        let mut seq_lengths = vec![0.0; n * seqs.len()];
        for (f, l) in feats.iter().enumerate() {
            match l {
                None => {
                    for bag in &bags[f] {
                        lengths.push(bag.len() as u32);
                        ids.extend(bag);
                    }
                }
                Some(l) => {
                    for j in 0..*l {
                        for bag in &bags[f] {
                            lengths.push(u32::from(j < bag.len()));
                            ids.extend(bag.get(j));
                        }
                    }
                    let s = seqs.iter().position(|&x| x == f).unwrap();
                    for (b, bag) in bags[f].iter().enumerate() {
                        seq_lengths[b * seqs.len() + s] = bag.len() as f32;
                    }
                }
            }
        }
        (lengths, ids, seq_lengths)
    }

    /// Random features (pooled and sequences of max_len 1-5), samples (none, one, several) and
    /// bags (empty, past max_len), ids 32- and 64-bit: the spread is the reference's, and the
    /// stage's features are the spread's.
    #[test]
    fn spreading_matches_the_reference_on_random_batches() {
        let mut rng = StdRng::seed_from_u64(5);
        for case in 0..200 {
            let nf = rng.random_range(1..5);
            let feats: Vec<Option<usize>> = (0..nf)
                .map(|_| rng.random_bool(0.6).then(|| rng.random_range(1..6)))
                .collect();
            let n = [0, 1, 3, 8][case % 4];
            let bags: Vec<Vec<Vec<i64>>> = feats
                .iter()
                .map(|l| {
                    let most = l.map_or(3, |l| 2 * l + 1);
                    (0..n)
                        .map(|_| {
                            (0..rng.random_range(0..most))
                                .map(|_| rng.random_range(0..9))
                                .collect()
                        })
                        .collect()
                })
                .collect();
            let cfg = config(&feats, 9);
            let s = Sequences::new(&cfg, &vec![9; nf]);
            let Some(s) = s else {
                assert!(feats.iter().all(Option::is_none));
                continue;
            };
            let stage = Sequences::stage_features(&cfg);
            assert_eq!(
                stage.len(),
                feats.iter().map(|l| l.unwrap_or(1)).sum::<usize>()
            );
            let lengths: Vec<usize> = bags.iter().flat_map(|f| f.iter().map(Vec::len)).collect();
            let flat: Vec<i64> = bags.iter().flatten().flatten().copied().collect();
            let (want_l, want_i, want_s) = reference(&feats, &bags);
            for wide in [false, true] {
                let ids = match wide {
                    true => Ids::I64(flat.clone()),
                    false => Ids::U32(flat.iter().map(|&i| i as u32).collect()),
                };
                let got = s.spread(n, |i| lengths[i], &ids).unwrap();
                assert_eq!(got.lengths, want_l, "case {case}");
                assert_eq!(got.lengths.len(), stage.len() * n, "case {case}");
                let got_ids: Vec<i64> = (0..got.ids.len()).map(|i| got.ids.get(i)).collect();
                assert_eq!(got_ids, want_i, "case {case}");
                assert_eq!(got.seq_lengths, want_s, "case {case}");
            }
            let dense: Vec<f32> = (0..n * 3).map(|i| i as f32).collect();
            let wide = s.widen(&dense, 3, &want_s);
            let w = 3 + s.count();
            assert_eq!(wide.len(), n * w);
            for b in 0..n {
                assert_eq!(wide[b * w..b * w + 3], dense[b * 3..b * 3 + 3]);
                assert_eq!(
                    wide[b * w + 3..(b + 1) * w],
                    want_s[b * s.count()..(b + 1) * s.count()]
                );
            }
        }
    }

    /// What a request gets wrong is named: ids that the lengths do not add up to, an id out of
    /// its table past max_len (never looked up, checked all the same), a negative one.
    #[test]
    fn bad_sequences_are_refused_naming_the_feature() {
        let feats = [None, Some(2)];
        let s = Sequences::new(&config(&feats, 9), &[9, 9]).unwrap();
        let lengths = [1usize, 0, 0, 4];
        let e = s
            .spread(2, |i| lengths[i], &Ids::I64(vec![1, 2, 3]))
            .unwrap_err();
        assert!(e.to_string().contains("add up to 5 ids but 3"), "{e}");
        let e = s
            .spread(2, |i| lengths[i], &Ids::I64(vec![1, 2, 3, 4, 9]))
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("f1: id 9 of sample 1 is out of range (the table has 9 rows)"),
            "{e}"
        );
        let e = s
            .spread(2, |i| lengths[i], &Ids::I64(vec![1, 2, -3, 4, 5]))
            .unwrap_err();
        assert!(e.to_string().contains("f1: id -3 of sample 1"), "{e}");
        assert!(
            s.spread(2, |i| lengths[i], &Ids::I64(vec![1, 2, 3, 4, 8]))
                .is_ok()
        );
    }

    /// Only a graph model takes sequence features, each max_len in 1..=MAX_LEN.
    #[test]
    fn max_len_is_checked() {
        let mut cfg = config(&[Some(3)], 9);
        assert!(cfg.check_sequences().is_ok());
        for bad in [0, MAX_LEN + 1] {
            cfg.features.as_mut().unwrap()[0].max_len = Some(bad);
            let e = cfg.check_sequences().unwrap_err().0;
            assert!(
                e.contains("f0") && e.contains(&format!("max_len {bad}")),
                "{e}"
            );
        }
        cfg.features.as_mut().unwrap()[0].max_len = Some(3);
        cfg.interaction = crate::config::InteractionConfig::Cat {};
        let e = cfg.check_sequences().unwrap_err().0;
        assert!(e.contains("only a graph model"), "{e}");
    }
}
