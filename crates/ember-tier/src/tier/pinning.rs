//! The pinned policy's hot set: the hottest ids of a trace ([`hottest`]), and loading a set into
//! a tier table's cache (rows already cached are copied, the others fetched in bounded chunks).

use super::inner::{Inner, Miss};
use super::stats::Counters;
use ember_embed::Result;
use std::collections::HashMap;

impl Inner {
    /// Pins `ids` (hottest first) in tier table `d`: rows already cached are copied, the others
    /// fetched in chunks of at most `PIN_CHUNK` rows (bounded buffers).
    pub(super) fn pin(&mut self, d: usize, ids: &[usize], counters: &Counters) -> Result<()> {
        const PIN_CHUNK: usize = 16 << 10;
        let rb = self.tables[d].row_bytes;
        let mut rows = vec![0u8; ids.len() * rb];
        self.misses.clear();
        for (slot, &id) in ids.iter().enumerate() {
            // A peek: pinning is no access (it would count each pinned id once more, and a
            // refresh from live counts would keep the old set over ids as frequent).
            match self.tables[d].cache.peek(id as u64) {
                Some(row) => rows[slot * rb..(slot + 1) * rb].copy_from_slice(row),
                None => self.misses.push(Miss {
                    tier: d,
                    id,
                    feature: 0,
                    slot,
                }),
            }
        }
        let missing = std::mem::take(&mut self.misses);
        for chunk in missing.chunks(PIN_CHUNK) {
            self.misses.clear();
            self.misses.extend_from_slice(chunk);
            let io = self.fetch_misses(counters, |m, row, _| {
                rows[m.slot * rb..(m.slot + 1) * rb].copy_from_slice(row)
            })?;
            Counters::add_time(&counters.io_ns, io);
        }
        self.misses.clear();
        let cache = &mut self.tables[d].cache;
        cache.pin(
            ids.iter()
                .enumerate()
                .map(|(slot, &id)| (id as u64, &rows[slot * rb..(slot + 1) * rb])),
        );
        Ok(())
    }
}

/// The `k` most frequent ids below `rows` in `trace`, most frequent first (ties: smaller id).
pub fn hottest(trace: &[u64], rows: usize, k: usize) -> Vec<usize> {
    let mut counts: HashMap<u64, u32> = HashMap::new();
    for &id in trace.iter().filter(|&&i| i < rows as u64) {
        *counts.entry(id).or_default() += 1;
    }
    let mut v: Vec<(u64, u32)> = counts.into_iter().collect();
    v.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v.into_iter().take(k).map(|(id, _)| id as usize).collect()
}
