//! The laid-out row files of `bench tiered`: the same seeded tables as the row-ordered ones, their
//! rows placed by a profile ([`RowLayout::from_profile`]: the rows the cache keeps first, by
//! heat; the rest by first access, so that rows used together share blocks). The tier reads them
//! with the same ids and must pool the same bytes (checked against DRAM like every policy).

use anyhow::Result;
use ember_bench::workload::IdSource;
use ember_embed::rowfile::{LayoutSummary, RowLayout};
use ember_embed::trace::load_trace;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::setup::Shape;
use super::{TieredArgs, row_files};

/// The laid-out files, and how the profile placed the rows.
pub(super) struct Laid {
    pub(super) paths: Vec<PathBuf>,
    pub(super) summary: LayoutSummary,
    pub(super) profile: String,
    pub(super) hot_rows: usize,
}

/// Writes (or reuses) one laid-out file per table, from `--layout-profile` or the `--ids` trace;
/// `None`, saying why, when there is no profile or no policy to run on them.
pub(super) fn laid_out_files(t: &TieredArgs, s: Shape, source: &IdSource) -> Result<Option<Laid>> {
    if t.layout_policies.is_empty() {
        return Ok(None);
    }
    let (profile, ids) = match (&t.layout_profile, source) {
        (Some(p), _) => (p.display().to_string(), Arc::new(load_trace(p)?)),
        (None, IdSource::Trace { path, ids }) => (path.clone(), ids.clone()),
        (None, _) => {
            eprintln!("layout: skipped (no profile: give --layout-profile, or --ids with a trace)");
            return Ok(None);
        }
    };
    let a = &t.embed;
    let row_bytes = a.dtype.row_bytes(s.dim);
    // The cache is shared by the tables in proportion to their sizes: equal here.
    let hot_rows = t
        .layout_hot_rows
        .unwrap_or((t.cache_mb << 20) / s.tables.max(1) / row_bytes);
    let t0 = Instant::now();
    // Every table replays the same trace (from its own offset): one layout serves them all.
    let (layout, summary) = RowLayout::from_profile(s.rows, &ids, hot_rows)?;
    // FNV-1a of the positions names the files: another profile writes other files.
    let tag = layout
        .slots()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &p| {
            (h ^ u64::from(p)).wrapping_mul(0x0100_0000_01b3)
        }) as u32;
    eprintln!(
        "layout: {} hot rows by heat, {} warm by first access, {} unmet ({} profile ids past the \
         table) from {profile} in {:.1} s",
        summary.hot,
        summary.warm,
        summary.cold,
        summary.out_of_range,
        t0.elapsed().as_secs_f64()
    );
    let paths = row_files(t, s, Some((&layout, &format!("-layout{tag:08x}"))))?;
    Ok(Some(Laid {
        paths,
        summary,
        profile,
        hot_rows,
    }))
}
