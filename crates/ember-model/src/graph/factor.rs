//! A linear layer over a join, factored ([`Kind::Factored`](super::plan::Kind), from
//! `Plan::factored`): a layer is linear in each part of its input, so `[p_1, .., p_n] W =
//! p_1 W_1 + .. + p_n W_n`. Parts that are sums or differences of values are spread over
//! those values (`(q - k) W_4 = q W_4 - k W_4`), each value's weights summed over the parts it
//! appears in; a value that is another broadcast along the rows (an `Expand` of one row a
//! sample) is multiplied once, on its rows before the repeat, and added to each of its rows in
//! the layer's epilogue. DIN's activation unit joins `[q, k, q * k, q - k]`, `q` the candidate
//! repeated over the history: its first layer then reads `[k, q * k]`, half the inputs
//! (`docs/graph-models.md`).
//!
//! The plan cannot know the shapes; the step checks them each run and, where they do not fit
//! (the parts of unequal widths, an operand that broadcasts, a join on another axis), runs the
//! join and the layer as the graph has them.

use super::compute::Binary;
use super::join::Part;
use super::tensor::Tensor;
use crate::mlp::Linear;

/// A factored layer (see the module's docs). Parts index the step's inputs.
#[derive(Debug)]
pub(super) struct Factored {
    /// The join's axis and parts, and the layer, as the graph has them.
    pub axis: i64,
    pub parts: Vec<Part>,
    pub layer: Linear,
    /// Each part's width: the layer's inputs split evenly over the parts.
    pub width: usize,
    /// The join the factored layer reads, and the layer (its bias, no ReLU where a broadcast
    /// part follows).
    pub rows: Vec<Part>,
    pub main: Linear,
    /// The values broadcast along the rows, each multiplied on its rows before the repeat.
    pub side: Vec<Side>,
}

/// A value repeated along the rows (`expanded`, an `Expand` of `source`), and its weights
/// (`[out, width]`, no bias).
#[derive(Debug)]
pub(super) struct Side {
    pub source: usize,
    pub expanded: usize,
    pub layer: Linear,
}

/// What a part is a sum of: an input as it is, or the part itself (a product or quotient).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Atom {
    Value(usize),
    Part(usize),
}

impl Factored {
    /// `layer` over the join of `parts` on `axis`, factored; `value(i)`: the first of the
    /// step's inputs that is the same value as input `i` (parts read a value through several
    /// inputs); `expanded(i)`: the step input of the value that input `i` is an `Expand` of, if
    /// it is one. The layer back where factoring does not shrink its input (no two parts share
    /// a value and none is broadcast) or its inputs do not split evenly over the parts.
    pub(super) fn new(
        layer: Box<Linear>,
        axis: i64,
        parts: Vec<Part>,
        value: impl Fn(usize) -> usize,
        expanded: impl Fn(usize) -> Option<usize>,
    ) -> Result<Factored, Box<Linear>> {
        let (n, inp) = (parts.len(), layer.in_dim());
        if n < 2 || inp % n != 0 {
            return Err(layer);
        }
        let (d, out) = (inp / n, layer.out_dim());
        // Each atom with its weights `[out, d]`, in order of first use.
        let mut atoms: Vec<(Atom, Vec<f32>)> = Vec::new();
        let w = layer.weight();
        for (p, part) in parts.iter().enumerate() {
            let v = |i: usize| Atom::Value(value(i));
            let terms: Vec<(Atom, f32)> = match *part {
                Part::Copy(i) => vec![(v(i), 1.0)],
                Part::Op(Binary::Add, a, b) => vec![(v(a), 1.0), (v(b), 1.0)],
                Part::Op(Binary::Sub, a, b) => vec![(v(a), 1.0), (v(b), -1.0)],
                Part::Op(..) => vec![(Atom::Part(p), 1.0)],
            };
            for (atom, c) in terms {
                let at = match atoms.iter().position(|(a, _)| *a == atom) {
                    Some(at) => at,
                    None => {
                        atoms.push((atom, vec![0.0; out * d]));
                        atoms.len() - 1
                    }
                };
                let aw = &mut atoms[at].1;
                for o in 0..out {
                    let src = &w[o * inp + p * d..o * inp + (p + 1) * d];
                    for (v, &s) in aw[o * d..(o + 1) * d].iter_mut().zip(src) {
                        *v += c * s;
                    }
                }
            }
        }
        let (mut rows, mut main_w, mut side) = (Vec::new(), Vec::new(), Vec::new());
        for (atom, aw) in atoms {
            match atom {
                Atom::Value(i) => match expanded(i) {
                    Some(source) => side.push(Side {
                        source,
                        expanded: i,
                        layer: Linear::new(d, out, aw, vec![0.0; out], false),
                    }),
                    None => {
                        rows.push(Part::Copy(i));
                        main_w.push(aw);
                    }
                },
                Atom::Part(p) => {
                    rows.push(parts[p]);
                    main_w.push(aw);
                }
            }
        }
        if rows.is_empty() || rows.len() >= n {
            return Err(layer);
        }
        let k = rows.len() * d;
        let mut wm = vec![0.0f32; out * k];
        for (a, aw) in main_w.iter().enumerate() {
            for o in 0..out {
                wm[o * k + a * d..o * k + (a + 1) * d].copy_from_slice(&aw[o * d..(o + 1) * d]);
            }
        }
        let relu = layer.relu() && side.is_empty();
        let main = Linear::new(k, out, wm, layer.bias().to_vec(), relu);
        Ok(Factored {
            axis,
            parts,
            layer: *layer,
            width: d,
            rows,
            main,
            side,
        })
    }

    /// The layers the step may run (packed for a dense dtype at load).
    pub(super) fn layers(&self) -> impl Iterator<Item = &Linear> {
        [&self.layer, &self.main]
            .into_iter()
            .chain(self.side.iter().map(|s| &s.layer))
    }

    /// Where the step's inputs fit the factored form: the rows' leading shape (the join's but
    /// its last axis) and how many rows each row of the broadcast values' products spans.
    /// `None`: run the join and the layer as the graph has them.
    pub(super) fn fits(&self, args: &[Option<&Tensor>]) -> Option<(Vec<usize>, usize)> {
        let d = self.width;
        let arg = |i: usize| {
            args.get(i)
                .copied()
                .flatten()
                .filter(|t| t.as_f32().is_some())
        };
        let first = match self.rows[0] {
            Part::Copy(i) | Part::Op(_, i, _) => arg(i)?,
        };
        let (&last, lead) = first.shape.split_last()?;
        let ax = if self.axis < 0 {
            self.axis + first.shape.len() as i64
        } else {
            self.axis
        };
        if last != d || ax != lead.len() as i64 {
            return None;
        }
        // Every value a part reads has the join's row shape (no operand broadcasts).
        let full = |i: usize| arg(i).is_some_and(|t| t.shape == first.shape);
        let whole = self.parts.iter().all(|p| match *p {
            Part::Copy(i) => full(i),
            Part::Op(_, a, b) => full(a) && full(b),
        });
        if !whole {
            return None;
        }
        // Each source: `lead[..t]` then ones, then `d` (left-padded with ones).
        let mut per = None;
        for s in &self.side {
            let u = arg(s.source)?;
            let (&ul, us) = u.shape.split_last()?;
            if ul != d || us.len() > lead.len() || !full(s.expanded) {
                return None;
            }
            let mut padded = vec![1; lead.len() - us.len()];
            padded.extend_from_slice(us);
            let t = padded.iter().rposition(|&x| x != 1).map_or(0, |i| i + 1);
            if padded[..t] != lead[..t] {
                return None;
            }
            let p: usize = lead[t..].iter().product();
            if per.is_some_and(|q| q != p) {
                return None;
            }
            per = Some(p);
        }
        Some((lead.to_vec(), per.unwrap_or(1)))
    }
}
