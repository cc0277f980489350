//! Row updates as the tier follows them, whatever carries them: an [`UpdateSource`] is polled
//! for what was published since its position in each table's feed ([`Polled`]), and says where it
//! is ([`EntryId`]). The stager's `ember-updates` thread (`crate::tier`) polls one and applies what
//! it reads between batches.
//!
//! One source is [`crate::storage::remote::updates::UpdateReader`] (a Redis Stream per table);
//! another (a Kafka topic, a file tailed) is one file implementing [`UpdateSource`], opened
//! beside its store ([`OpenedSource`]) by the tier's store factory (`tier/stores.rs`).

use ember_embed::Result;
use std::fmt;

/// A position in a table's feed, ordered as the feed orders its entries: the publisher's
/// milliseconds and a sequence within them (a Redis Stream's entry id, `<ms>-<seq>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct EntryId(pub u64, pub u64);

impl EntryId {
    /// Parses `<ms>-<seq>`.
    pub fn parse(s: &[u8]) -> Option<EntryId> {
        let s = std::str::from_utf8(s).ok()?;
        let (a, b) = s.split_once('-')?;
        Some(EntryId(a.parse().ok()?, b.parse().ok()?))
    }
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.0, self.1)
    }
}

/// A table a source follows: its name and shape (its index is its place in the source's list).
#[derive(Debug, Clone)]
pub struct FollowedTable {
    pub name: String,
    pub rows: usize,
    pub row_bytes: usize,
}

/// What [`UpdateSource::poll`] found, per table (its index in the tables followed).
#[derive(Debug, Clone, PartialEq)]
pub enum Polled {
    /// New rows: ids, and the rows in the table's encoding; published at `published_ms`.
    Rows {
        table: usize,
        entry: EntryId,
        ids: Vec<u64>,
        rows: Vec<u8>,
        published_ms: u64,
    },
    /// The feed lost entries past this reader's position (a stream trimmed): updates were lost
    /// to it, and the reader goes on from the feed's newest entry (`now_at`).
    Reset { table: usize, now_at: EntryId },
    /// An entry that is not a well-formed update of this table (skipped; `reason` says why).
    Bad {
        table: usize,
        entry: EntryId,
        reason: String,
    },
}

/// Where row updates come from: polled by one thread, from its position in each table's feed
/// (taken when it was opened, so that nothing published after is missed).
pub trait UpdateSource: fmt::Debug + Send {
    /// What it follows, for metrics (their `model` label) and messages.
    fn name(&self) -> &str;
    /// The names of the tables it follows, in order.
    fn tables(&self) -> Vec<String>;
    /// Reads what was published since the last poll (at most [`UpdateSource::batch`] entries
    /// per table), in feed order per table.
    fn poll(&mut self) -> Result<Vec<Polled>>;
    /// The position in each table's feed.
    fn positions(&self) -> Vec<EntryId>;
    /// Whether any update was ever published for table `i` (before this source opened, or
    /// since): its rows in the store may differ from those pushed.
    fn published(&self, i: usize) -> bool;
    /// Entries a poll reads per table at most (a poll that returned as many has more waiting).
    fn batch(&self) -> usize;
}

/// An in-memory table that a source may follow too: its index in the caller's list of tables,
/// name and shape.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveTable {
    pub name: String,
    pub rows: usize,
    pub dim: usize,
    pub dtype: ember_embed::DType,
    pub row_bytes: usize,
}

/// A source opened beside a store, positions taken: the store's tables first (in the store's
/// order), then the live tables it holds (`live`: their indices in the list it was given, in
/// order), and a store that reads those live tables whole (`reload`, its tables in the order of
/// `live`), for when their updates were lost.
#[derive(Debug)]
pub struct OpenedSource {
    pub source: Box<dyn UpdateSource>,
    pub live: Vec<usize>,
    pub reload: Option<Box<dyn super::RowStore>>,
}
