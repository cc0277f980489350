//! The one error type of `ember-embed`. Variants carry the numbers that explain them, so that a
//! message names the feature, the sample and the bad value without the caller adding context.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use thiserror::Error;

/// Everything that can go wrong when building tables and batches or running a pooled lookup.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum EmbedError {
    // ----- batch structure (KeyedJagged) -----
    /// `lengths` does not have one entry per (feature, sample).
    #[error(
        "lengths has {got} entries, expected {features} features x {batch_size} samples = {expected}"
    )]
    LengthsCount {
        got: usize,
        features: usize,
        batch_size: usize,
        expected: usize,
    },
    /// The lengths add up to a different number of ids than were given.
    #[error("lengths add up to {sum} ids but {ids} ids were given")]
    LengthsSum { sum: usize, ids: usize },
    /// `offsets` has the wrong number of entries.
    #[error("offsets has {got} entries, expected {expected} (features x batch size + 1)")]
    OffsetsCount { got: usize, expected: usize },
    /// `offsets[0]` must be zero.
    #[error("offsets[0] is {first}, expected 0")]
    OffsetsStart { first: usize },
    /// Offsets must never decrease.
    #[error("offsets decrease at feature '{feature}', sample {sample}: {from} -> {to}")]
    OffsetsDecreasing {
        feature: String,
        sample: usize,
        from: usize,
        to: usize,
    },
    /// The last offset must equal the number of ids.
    #[error("last offset is {last} but {ids} ids were given")]
    OffsetsEnd { last: usize, ids: usize },
    /// Per-id weights must have one entry per id.
    #[error("weights has {weights} entries but there are {ids} ids")]
    WeightsLen { weights: usize, ids: usize },
    /// A signed id was negative.
    #[error("feature '{feature}', sample {sample}: id {id} is negative")]
    NegativeId {
        feature: String,
        sample: usize,
        id: i64,
    },
    /// An id is not a row of the feature's table.
    #[error(
        "feature '{feature}', sample {sample}: id {id} is out of range for table '{table}' with {rows} rows"
    )]
    IdOutOfRange {
        feature: String,
        sample: usize,
        id: i64,
        table: String,
        rows: usize,
    },
    /// The batch's feature keys differ from the collection's features.
    #[error("batch feature keys {got:?} do not match the model's features {expected:?}")]
    KeysMismatch {
        got: Vec<String>,
        expected: Vec<String>,
    },
    /// Two features share a key.
    #[error("feature key '{key}' appears twice")]
    DuplicateKey { key: String },

    // ----- tables -----
    /// A table shape that cannot be built.
    #[error("table '{table}': {reason}")]
    BadTable { table: String, reason: String },
    /// The f32 source for a table has the wrong length.
    #[error("table '{table}': {got} values given, expected rows {rows} x dim {dim} = {expected}")]
    TableValues {
        table: String,
        got: usize,
        rows: usize,
        dim: usize,
        expected: usize,
    },
    /// A feature refers to a table that does not exist.
    #[error("feature '{feature}' refers to table index {table}, but there are {tables} tables")]
    NoSuchTable {
        feature: String,
        table: usize,
        tables: usize,
    },
    /// Memory for a table could not be mapped.
    #[error("could not allocate {bytes} bytes for table '{table}': {cause}")]
    Alloc {
        table: String,
        bytes: usize,
        /// The mapping's error.
        #[source]
        cause: Cause,
    },
    /// A dtype name that is not known.
    #[error("unknown dtype '{0}' (expected f32, f16, bf16, int8 or int4)")]
    UnknownDType(String),

    // ----- pooled lookup -----
    /// Weighted pooling without weights.
    #[error("pooling is weighted_sum but the batch carries no per-id weights")]
    MissingWeights,
    /// Weights given with an unweighted pooling mode.
    #[error("the batch carries per-id weights but pooling is {pooling}; use weighted_sum")]
    UnexpectedWeights { pooling: &'static str },
    /// The output buffer has the wrong size.
    #[error(
        "output buffer has {got} floats, expected batch size {batch_size} x total dim {dim} = {expected}"
    )]
    OutputLen {
        got: usize,
        batch_size: usize,
        dim: usize,
        expected: usize,
    },
    /// A batch checked against one collection given to another (a bug of the caller).
    #[error("the batch was checked against another collection of tables")]
    WrongCollection,
    /// A sharding plan that does not fit the tables (coverage, overlap, ranges).
    #[error("sharding plan: {0}")]
    Sharding(#[source] ShardError),
    /// An ISA was requested that this CPU does not have.
    #[error("instruction set {isa} is not available on this CPU")]
    IsaUnavailable { isa: &'static str },
    /// A thread pool could not be created.
    #[error("could not start a thread pool of {threads} threads: {cause}")]
    ThreadPool {
        threads: usize,
        /// Rayon's error.
        #[source]
        cause: Cause,
    },
    /// A bad option value.
    #[error("invalid option {option}: {reason}")]
    BadOption {
        option: &'static str,
        reason: String,
    },

    // ----- the SSD tier -----
    /// A row file that cannot be used: not one, a version this build does not read, truncated,
    /// or its header or checksum table damaged.
    #[error("row file {path}: {reason}")]
    RowFile { path: String, reason: String },
    /// A row file whose header cannot be used: not a row file, a version this build does not
    /// read, damaged, or fields that disagree.
    #[error("row file {path}: {cause}")]
    RowFileHeader {
        path: String,
        #[source]
        cause: HeaderError,
    },
    /// A laid-out row file whose stored positions are not a permutation of its rows.
    #[error("row file {path}: layout is not a permutation: {cause}")]
    RowFileLayout {
        path: String,
        #[source]
        cause: LayoutError,
    },
    /// A block of a row file does not match its checksum: the file was damaged after it was
    /// written. No row of that block is returned.
    #[error(
        "row file {path}: block {block} (bytes {offset}..{end}) fails its checksum \
         (stored {stored:08x}, read {actual:08x}); the file is corrupted, rewrite it with `ember convert`",
        end = offset + *len as u64
    )]
    Corrupt {
        path: String,
        block: u64,
        offset: u64,
        len: usize,
        stored: u32,
        actual: u32,
    },
    /// Reading or writing a row file failed.
    #[error("row file {path}: {op}: {cause}")]
    Io {
        path: String,
        op: &'static str,
        /// The I/O error.
        #[source]
        cause: Cause,
    },
    /// A read of `len` bytes at `offset` of a row file failed.
    #[error("row file {path}: read: {len} bytes at offset {offset}: {cause}")]
    ReadAt {
        path: String,
        len: usize,
        offset: u64,
        /// The I/O error.
        #[source]
        cause: Cause,
    },
    /// A lookup reached a table on the SSD tier without its rows staged first.
    #[error(
        "table '{table}' is on the SSD tier and its rows were not staged for this batch: stage the \
         batch (Stager::stage) and pool that batch with the result (Pooler::run_staged)"
    )]
    NotStaged { table: String },

    // ----- the remote tier (a Redis Cluster) -----
    /// The store could not answer in time: a node is down, unreachable, paused, or failing over.
    /// Requests needing it fail fast; it is retried on the next batch.
    #[error("{store} is unavailable ({kind}{at}): {detail}", at = if node.is_empty() { String::new() } else { format!(" at {node}") })]
    StoreUnavailable {
        store: String,
        kind: &'static str,
        node: String,
        detail: String,
    },
    /// A model or version in the store that cannot be served as asked.
    #[error("remote store: model '{model}' version {version}: {reason}")]
    RemoteStore {
        model: String,
        version: u64,
        reason: String,
    },
    /// A row that is missing in the store or of the wrong length (a partial or damaged push).
    /// Never served as zeros.
    #[error(
        "remote store: model '{model}' version {version}, table '{table}', row {row}: {reason}"
    )]
    RemoteRow {
        model: String,
        version: u64,
        table: String,
        row: usize,
        reason: String,
    },

    /// A row update refused before any of it was written: blocks of its table are missing or
    /// short in the store (`found` says which: a node lost its data, or the push did not
    /// finish). Push the version again; the update can then be sent again.
    #[error(
        "remote store: model '{model}' version {version}, table '{table}': {found} in the store \
         (a node lost its data, or the push did not finish); nothing of this update was written \
         by this call: push the version again"
    )]
    UpdateRefused {
        model: String,
        version: u64,
        table: String,
        found: String,
    },

    // ----- workloads -----
    /// An id trace file that cannot be used: a line that is not an id, no ids, a table name
    /// that cannot name a profile file.
    #[error("id trace {path}: {reason}")]
    Trace { path: String, reason: String },
    /// Reading or writing an id trace file failed.
    #[error("id trace {path}: {cause}")]
    TraceIo {
        path: String,
        /// The I/O error.
        #[source]
        cause: Cause,
    },
}

/// Why a sharding plan does not fit its tables, or a device's part of it failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    /// A shard names a table past the list.
    #[error("a shard names table {table}, there are {tables}")]
    NoTable { table: usize, tables: usize },
    /// A shard is empty or reaches outside its table.
    #[error(
        "shard rows {rows:?} cols {cols:?} is empty or outside table {table} ({table_rows} x {dim})"
    )]
    Outside {
        rows: (u64, u64),
        cols: (u32, u32),
        table: String,
        table_rows: u64,
        dim: u32,
    },
    /// Two shards of a table share cells.
    #[error("two shards of table {table} overlap")]
    Overlap { table: String },
    /// The shards of a table leave cells out (their areas do not add up to the table's).
    #[error("the shards of table {table} do not cover it exactly")]
    NotCovered { table: String },
    /// A device was given a different number of tables than shards.
    #[error("{tables} tables for {shards} shards")]
    Count { tables: usize, shards: usize },
    /// A device's table is not the shape of its shard.
    #[error("table {table} is {rows} x {dim}, its shard rows {shard_rows:?} cols {shard_cols:?}")]
    Shape {
        table: String,
        rows: usize,
        dim: usize,
        shard_rows: (u64, u64),
        shard_cols: (u32, u32),
    },
    /// A device's pooling thread panicked (a bug).
    #[error("a device's pooling panicked")]
    Panicked,
}

/// Why a row file's header cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HeaderError {
    #[error("{len} bytes, shorter than the {header}-byte header (truncated, or not a row file)")]
    Short { len: usize, header: usize },
    #[error("not a row file (bad magic; write one with `ember convert`)")]
    Magic,
    #[error("format version {found}, this build reads versions {} and {}", reads.0, reads.1)]
    Version { found: u32, reads: (u32, u32) },
    #[error(
        "header checksum mismatch (stored {stored:08x}, computed {actual:08x}): the header is damaged"
    )]
    Checksum { stored: u32, actual: u32 },
    #[error("unknown dtype code {code}")]
    DType { code: u32 },
    #[error("name length {len} is over {max}")]
    NameLength { len: usize, max: usize },
    #[error("table name is not UTF-8")]
    NameNotUtf8,
    #[error("{what} too large")]
    TooLarge { what: &'static str },
    /// The shape it states cannot be laid out (the layout's own error).
    #[error("{0}")]
    Shape(#[source] Box<EmbedError>),
    #[error("header fields are inconsistent with {rows} rows x dim {dim} {dtype}")]
    Inconsistent {
        rows: usize,
        dim: usize,
        dtype: &'static str,
    },
}

/// Why rows and positions are not a layout: not a permutation of a table's rows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("{rows} rows: a layout covers at most {max}")]
    TooManyRows { rows: usize, max: usize },
    /// In an order: position `position` names a row past the table.
    #[error("position {position} holds row {row}, past the {rows} rows")]
    RowPastEnd {
        position: usize,
        row: u32,
        rows: usize,
    },
    /// In an order: row `row` at two positions.
    #[error("row {row} is placed twice (positions {first} and {second})")]
    RowTwice { row: u32, first: u32, second: usize },
    /// In stored positions: row `row` placed past the data.
    #[error("row {row} is at position {position}, past the {rows} rows")]
    PositionPastEnd {
        row: usize,
        position: u32,
        rows: usize,
    },
    /// In stored positions: two rows at one position.
    #[error("position {position} holds two rows ({first} and {second})")]
    PositionTwice {
        position: u32,
        first: u32,
        second: usize,
    },
}

/// The error that caused an [`EmbedError`], kept whole so that
/// [`source()`](std::error::Error::source) of the `EmbedError` is that error itself (an
/// [`std::io::Error`] downcasts as one), while `EmbedError` stays `Clone` and `PartialEq`: the
/// error is shared, and two causes are equal when their messages are.
///
/// It displays as the error does and dereferences to it. It is not an error itself, on purpose:
/// `#[source]` then reaches through it to the error it holds, so a chain of causes does not
/// show the same message twice.
#[derive(Clone)]
pub struct Cause(Arc<dyn StdError + Send + Sync>);

impl Cause {
    /// Wraps `error`.
    pub fn new(error: impl StdError + Send + Sync + 'static) -> Self {
        Cause(Arc::new(error))
    }
}

impl std::ops::Deref for Cause {
    type Target = dyn StdError + Send + Sync;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl From<std::io::Error> for Cause {
    fn from(e: std::io::Error) -> Self {
        Cause::new(e)
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// Equal when the messages are: errors such as [`std::io::Error`] have no equality of their own.
impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl EmbedError {
    /// [`EmbedError::RemoteStore`]: `model`'s `version` in the remote store cannot be served or
    /// managed as asked, for `reason`.
    pub fn remote_store(model: &str, version: u64, reason: impl Into<String>) -> Self {
        EmbedError::RemoteStore {
            model: model.into(),
            version,
            reason: reason.into(),
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = EmbedError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The error the operating system gives for `path`, which does not exist.
    fn missing(path: &Path) -> std::io::Error {
        std::fs::metadata(path).unwrap_err()
    }

    #[test]
    fn a_missing_row_file_keeps_its_io_error_as_the_source() {
        let path = std::env::temp_dir().join(format!("ember-no-such-{}.rows", std::process::id()));
        let e = crate::EmbeddingTable::open_row_file(&path).unwrap_err();
        assert!(matches!(e, EmbedError::Io { op: "open", .. }), "{e:?}");
        let io = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            io.map(|io| io.kind()),
            Some(std::io::ErrorKind::NotFound),
            "{e:?}"
        );
        // The message is the one the text variant printed.
        let old = format!("row file {}: open: {}", path.display(), missing(&path));
        assert_eq!(e.to_string(), old);
        // Clone and PartialEq still hold, by the message.
        assert_eq!(e.clone(), e);
        let other = EmbedError::Io {
            path: path.display().to_string(),
            op: "open",
            cause: std::io::Error::other("another error").into(),
        };
        assert_ne!(e, other);
    }

    #[test]
    fn a_missing_trace_keeps_its_io_error_as_the_source() {
        let path = Path::new("/nonexistent/ember/trace.ids");
        let e = crate::trace::load_trace(path).unwrap_err();
        assert!(matches!(e, EmbedError::TraceIo { .. }), "{e:?}");
        let io = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            io.map(|io| io.kind()),
            Some(std::io::ErrorKind::NotFound),
            "{e:?}"
        );
        let old = format!("id trace {}: {}", path.display(), missing(path));
        assert_eq!(e.to_string(), old);
    }

    #[test]
    fn a_thread_pool_error_is_the_source() {
        let build = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .spawn_handler(|_| Err(std::io::Error::other("no threads today")))
            .build()
            .unwrap_err();
        let text = build.to_string();
        let e = EmbedError::ThreadPool {
            threads: 1,
            cause: Cause::new(build),
        };
        assert_eq!(
            e.to_string(),
            format!("could not start a thread pool of 1 threads: {text}")
        );
        let source = e.source().unwrap();
        assert!(source.is::<rayon::ThreadPoolBuildError>(), "{source:?}");
    }
}
