//! A batch's outputs as every engine writes them and the serving seam
//! ([`crate::serving`]) answers them: per declared output, its values, item after item.

/// A batch's outputs: per declared output, its values, item after item; with runs,
/// `counts[i]` values of each output belong to item `i`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outputs {
    pub values: Vec<Vec<f32>>,
    /// Values per item (empty: one each).
    pub counts: Vec<u32>,
}

impl Outputs {
    /// Outputs of `outputs` outputs, emptied for the next batch.
    pub fn reset(&mut self, outputs: usize) {
        self.values.resize_with(outputs, Vec::new);
        self.values.iter_mut().for_each(Vec::clear);
        self.counts.clear();
    }

    /// The first output's values (a DLRM model's scores).
    pub fn scores(&self) -> &[f32] {
        self.values.first().map_or(&[], |v| v)
    }

    /// Items `items` of it (in order: `first_value` is where item `items.start`'s values
    /// start, 0 for the first part). Returns the part and where the next part's values start.
    pub fn part(&self, items: std::ops::Range<usize>, first_value: usize) -> (Outputs, usize) {
        let (counts, end) = match self.counts.is_empty() {
            true => (Vec::new(), first_value + items.len()),
            false => {
                let c = self.counts[items].to_vec();
                let k: usize = c.iter().map(|&c| c as usize).sum();
                (c, first_value + k)
            }
        };
        let values = self
            .values
            .iter()
            .map(|v| v[first_value..end].to_vec())
            .collect();
        (Outputs { values, counts }, end)
    }

    /// Appends `o` (the next items) to it.
    pub fn append(&mut self, o: &Outputs) {
        if self.values.len() < o.values.len() {
            self.values.resize_with(o.values.len(), Vec::new);
        }
        for (a, b) in self.values.iter_mut().zip(&o.values) {
            a.extend_from_slice(b);
        }
        self.counts.extend_from_slice(&o.counts);
    }

    /// Items in it.
    pub fn items(&self) -> usize {
        match self.counts.is_empty() {
            true => self.scores().len(),
            false => self.counts.len(),
        }
    }

    /// Where each item's values start, and the end: `items() + 1` offsets.
    pub fn offsets(&self) -> Vec<u64> {
        let mut at = 0u64;
        let mut v = Vec::with_capacity(self.items() + 1);
        v.push(0);
        match self.counts.is_empty() {
            true => v.extend(1..=self.scores().len() as u64),
            false => v.extend(self.counts.iter().map(|&c| {
                at += u64::from(c);
                at
            })),
        }
        v
    }
}
