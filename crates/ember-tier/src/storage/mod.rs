//! Where table rows live beyond DRAM, and how they are read.
//!
//! - [`rowfile`]: the on-disk format of one table (header, a CRC-32 per 4 KiB block, laid out
//!   for direct I/O), its writer and its reader.
//! - [`io`]: batched block reads, io_uring or a pool of `pread`s, up to a queue depth in flight.
//! - [`RowStore`]: the one interface of a backend that fetches rows for the SSD tier. The row
//!   cache, staging, deduplication of misses and next-batch prefetch above it
//!   ([`crate::tier`]) are shared by every backend; a backend only turns "these rows of these
//!   tables" into checked bytes. Two backends read row files:
//!   - [`FileStore`] ([`file`]): the I/O engine, with `O_DIRECT` where the filesystem allows it;
//!     adjacent blocks are merged into reads of up to 256 KiB.
//!   - [`MapStore`] (`mmap.rs`): a plain read-only mapping, rows copied out of the page cache.
//!
//!   A third reads rows from a Redis Cluster: [`remote::RedisStore`], for tables placed
//!   `remote` ([`remote`] has it, its key layout, its local-copy fallback and update streams).
//!
//!   `RowStore` is what every backend has: `engine`, `direct`, `row_bytes`, `read`. A backend
//!   that reads over the network implements [`remote::RemoteRows`] too: whether it answers now,
//!   its nodes' counters, and the row updates that a copy of its rows must follow. The tier
//!   keeps its local and remote stores apart (its store factory, `tier/stores.rs`, makes both
//!   from the tables' placements) and makes those calls on remote stores alone, so a local
//!   backend implements `RowStore` and nothing else.
//! - [`updates`]: row updates as the tier follows them, whatever carries them: the
//!   [`updates::UpdateSource`] trait (a Redis Stream per table is one, in [`remote`]).
//! - [`MappedRows`] (`mmap.rs`): the mapping that `mmap`-placed tables are read through in place
//!   (the page cache is their only cache, so they need no store).
//!
//! Nothing here knows tables, batches or caches: this module sits below [`ember_embed::EmbeddingTable`] and
//! [`crate::tier`], which use it.

pub mod io;
pub mod remote;
pub mod updates;

mod file;
mod mmap;

pub use file::FileStore;
pub use io::{IoKind, IoMode};
pub use mmap::MapStore;

use ember_embed::rowfile::RowFile;
use ember_embed::{EmbedError, Result};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// One row a store is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowRequest {
    /// The table, as an index into the tables the store was opened with.
    pub table: usize,
    /// The row of that table (below its row count: the caller checked).
    pub row: usize,
    /// The caller's own tag (where the row goes); the store hands it back with the row.
    pub tag: usize,
}

/// What one [`RowStore::read`] cost.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ReadStats {
    /// Requests to the device (merged block reads; for a mapping, every block touched, as the
    /// OS does not say which came from its page cache; round trips of a remote store).
    pub reads: u64,
    /// Bytes those requests moved (whole blocks for row files).
    pub bytes: u64,
    /// Time spent waiting for them.
    pub wait: Duration,
}

/// A backend that fetches rows of the tables it was opened with. One store serves every table
/// of its kind in a collection, so that it can batch a whole batch's reads across tables (one
/// io_uring submission, one pipeline per remote node).
///
/// Contract: [`RowStore::read`] calls `land` exactly once per request, with exactly
/// `row_bytes(request.table)` bytes that have passed the store's integrity check (a row file's
/// block checksum); on an error it has landed nothing, so that a failed batch leaves the caller's
/// buffers and cache untouched.
///
/// A store that reads over the network implements [`remote::RemoteRows`] too.
pub trait RowStore: fmt::Debug + Send {
    /// The engine behind it, for reports and logs: `"io_uring"`, `"pread"`, `"mmap"`.
    fn engine(&self) -> &'static str;
    /// Whether its reads bypass the OS page cache.
    fn direct(&self) -> bool;
    /// Bytes per row of `table`.
    fn row_bytes(&self, table: usize) -> usize;
    /// Reads every requested row; may reorder `reqs`. See the trait's contract.
    fn read(
        &mut self,
        reqs: &mut [RowRequest],
        land: &mut dyn FnMut(&RowRequest, &[u8]),
    ) -> Result<ReadStats>;
}

/// Opens the store that reads `files` (the row files of a collection's SSD-tier tables, in the
/// order requests name them) as `io` asks, keeping up to `queue_depth` reads in flight.
pub fn open_row_files(
    files: Vec<Arc<RowFile>>,
    io: IoMode,
    queue_depth: usize,
) -> Result<Box<dyn RowStore>> {
    let failed = |e: std::io::Error| EmbedError::BadOption {
        option: "io",
        reason: format!("could not start {} I/O: {e}", io.name()),
    };
    Ok(match io {
        IoMode::Mmap => Box::new(MapStore::open(files)?),
        _ => Box::new(FileStore::new(files, io, queue_depth).map_err(failed)?),
    })
}
