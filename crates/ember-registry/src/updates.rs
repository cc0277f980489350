//! Streaming row updates, their format and their producer: a producer writes new rows of a
//! served version to the store and publishes them on a Redis Stream per table; every server
//! reads the streams (`ember-tier`'s `UpdateReader`) and applies each update to the rows it
//! caches. [`Publisher`] writes a table's new rows into their blocks, only blocks that are there
//! at their full length ([`WRITE_ROWS`]), then publishes them as one stream entry.
//!
//! | what | where |
//! |---|---|
//! | the rows | written into their blocks **before** the entry is published, so a server that misses a row after reading the entry fetches the new bytes; only into blocks that are there at their full length ([`WRITE_ROWS`]: a block a node lost is never recreated as zeros around the row) |
//! | the entry | `XADD ember:<model>:v<N>:<table>:updates MAXLEN ~ <max> * ids <bytes> rows <bytes> ts <ms>` |
//! | `ids` | the rows' ids, unsigned 64-bit little-endian, back to back |
//! | `rows` | the rows in the table's own encoding ([`ember_embed::DType`]: f32 / f16 / bf16 little-endian, int8 / int4 with their scale and bias), `row_bytes` each, in the order of `ids` |
//! | `ts` | the publisher's clock when it published, milliseconds since the Unix epoch (decimal): the update lag is measured from it |
//!
//! The stream's entry order is the order updates apply in: publish the updates of one table from
//! one producer (or serialize them), so that the last write to a row is the last entry, on the
//! store and on every server alike. A stream is trimmed to about `max_len` entries; a server whose
//! position was trimmed away (it fell behind) cannot tell which rows it missed, and drops its
//! cache of that table (`Polled::Reset` in `ember-tier`).

use crate::layout::{self, block_prefix, updated_key, updates_key};
use crate::manifest::ManifestTable;
use crate::read::{read_manifest, resolve_version};
use crate::store_error;
use ember_embed::{EmbedError, Result};
use ember_redis::Value;
use ember_redis::{Cluster, Ops};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The entry's fields: the ids, the rows, the publisher's clock (see the module documentation).
pub const FIELD_IDS: &str = "ids";
pub const FIELD_ROWS: &str = "rows";
pub const FIELD_TS: &str = "ts";

/// Entries a stream keeps about (`XADD ... MAXLEN ~`), by default.
pub const DEFAULT_MAX_LEN: usize = 100_000;

/// Rows one entry carries at most (a producer splits larger updates).
pub const MAX_ENTRY_ROWS: usize = 1 << 16;

/// The Lua script that writes rows into one block (`EVAL WRITE_ROWS 1 <block key> <block bytes>
/// <offset> <row> [<offset> <row> ...]`), only if the block is there at its full length; else
/// it answers an error starting `EMBERBLOCK` and writes nothing. A plain `SETRANGE` on a block
/// that a node lost (restarted without its data) would recreate it as zeros around the row, and
/// those zeros would be served as rows: a producer in another language runs this script too.
pub const WRITE_ROWS: &str = "local n = redis.call('STRLEN', KEYS[1]) \
    if n ~= tonumber(ARGV[1]) then \
        return redis.error_reply('EMBERBLOCK ' .. KEYS[1] .. ' holds ' .. n .. ' bytes, not ' .. ARGV[1]) \
    end \
    for i = 2, #ARGV, 2 do redis.call('SETRANGE', KEYS[1], ARGV[i], ARGV[i + 1]) end \
    return (#ARGV - 1) / 2";

/// What [`publish`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct PublishReport {
    pub version: u64,
    pub rows: usize,
    /// The stream entry's id.
    pub entry: String,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Writes `rows` (`ids.len()` rows in the table's encoding) of `table` into version `version`
/// of `model` (`None`: the newest ready one), then publishes them as one stream entry (see the
/// module documentation). At most [`MAX_ENTRY_ROWS`] rows. To publish many entries, open a
/// [`Publisher`] once instead (this reads the version and its manifest on every call).
pub fn publish(
    cluster: &mut Cluster,
    model: &str,
    version: Option<u64>,
    table: &str,
    ids: &[u64],
    rows: &[u8],
    max_len: usize,
) -> Result<PublishReport> {
    Publisher::open(cluster, model, version, table)?.publish(cluster, ids, rows, max_len)
}

/// One block's rows of an update: the block, and each row's byte offset in it with its bytes.
type BlockRows<'a> = (usize, Vec<(usize, &'a [u8])>);

/// Publishes updates of one table of one version (see the module documentation).
#[derive(Debug, Clone)]
pub struct Publisher {
    model: String,
    version: u64,
    table: ManifestTable,
    /// The table's block keys' prefix, and its stream.
    prefix: String,
    key: String,
}

impl Publisher {
    /// Resolves `version` of `model` (`None`: the newest ready one) and reads `table`'s shape
    /// from its manifest.
    pub fn open(
        cluster: &mut Cluster,
        model: &str,
        version: Option<u64>,
        table: &str,
    ) -> Result<Self> {
        layout::check_name("model", model)?;
        let version = resolve_version(cluster, model, version)?;
        let manifest = read_manifest(cluster, model, version)?;
        let Some(t) = manifest.table(table) else {
            return Err(EmbedError::remote_store(
                model,
                version,
                format!("table '{table}': not in this version"),
            ));
        };
        Ok(Publisher::new(model, version, t))
    }

    /// For table `table` (from version `version`'s manifest) of `model`.
    pub fn new(model: &str, version: u64, table: &ManifestTable) -> Self {
        Publisher {
            model: model.into(),
            version,
            prefix: block_prefix(model, version, &table.name),
            key: updates_key(model, version, &table.name),
            table: table.clone(),
        }
    }

    /// The table's shape.
    pub fn table(&self) -> &ManifestTable {
        &self.table
    }

    /// Writes `rows` (`ids.len()` rows in the table's encoding) to their blocks, then publishes
    /// them as one entry, the stream trimmed to about `max_len` entries. At most
    /// [`MAX_ENTRY_ROWS`] rows.
    ///
    /// Every block is checked first: an update touching a block the store lost (or holds short)
    /// is refused whole, naming the blocks, and this call writes nothing. An update that fails
    /// otherwise (a node down, the deadline) may have written some of its rows and not published
    /// them: publish it again (the same rows) until it goes through, so that the servers learn
    /// of them; the store and the servers agree once it has.
    pub fn publish(
        &self,
        cluster: &mut Cluster,
        ids: &[u64],
        rows: &[u8],
        max_len: usize,
    ) -> Result<PublishReport> {
        let by_block = self.by_block(ids, rows)?;
        self.check_blocks(cluster, &by_block)?;
        let mut ops = Ops::default();
        let blocks: Vec<usize> = by_block.iter().map(|(b, _)| *b).collect();
        let updated = updated_key(&self.model, self.version, &self.table.name);
        let mut sadd = ember_redis::cmd("SADD");
        sadd.arg(&updated);
        for &b in &blocks {
            sadd.arg(b);
        }
        ops.push(updated.as_bytes(), &sadd);
        for (block, rows) in &by_block {
            let key = format!("{}{block}", self.prefix);
            let mut cmd = ember_redis::cmd("EVAL");
            cmd.arg(WRITE_ROWS)
                .arg(1)
                .arg(&key)
                .arg(self.block_bytes(*block));
            for (offset, row) in rows {
                cmd.arg(*offset).arg(*row);
            }
            ops.push(key.as_bytes(), &cmd);
        }
        let deadline = Instant::now() + cluster.options().timeout;
        cluster.run(&ops, false, deadline).map_err(store_error)?;
        let id_bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
        let mut ops = Ops::default();
        ops.push(
            self.key.as_bytes(),
            ember_redis::cmd("XADD")
                .arg(&self.key)
                .arg("MAXLEN")
                .arg("~")
                .arg(max_len.max(1))
                .arg("*")
                .arg(FIELD_IDS)
                .arg(id_bytes)
                .arg(FIELD_ROWS)
                .arg(rows)
                .arg(FIELD_TS)
                .arg(now_ms()),
        );
        let deadline = Instant::now() + cluster.options().timeout;
        let entry = match cluster
            .run(&ops, false, deadline)
            .map_err(store_error)?
            .pop()
        {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(&b).into_owned(),
            other => return Err(self.refuse(format!("XADD answered {other:?}"))),
        };
        Ok(PublishReport {
            version: self.version,
            rows: ids.len(),
            entry,
        })
    }

    /// Checks an update's shape and groups its rows by block: blocks in order, each block's
    /// rows in the order given (a row given twice: its last bytes win).
    fn by_block<'r>(&self, ids: &[u64], rows: &'r [u8]) -> Result<Vec<BlockRows<'r>>> {
        let t = &self.table;
        if ids.is_empty() || ids.len() > MAX_ENTRY_ROWS {
            return Err(self.refuse(format!(
                "{} rows in one update: give 1 to {MAX_ENTRY_ROWS}",
                ids.len()
            )));
        }
        if rows.len() != ids.len() * t.row_bytes {
            return Err(self.refuse(format!(
                "{} bytes of rows for {} ids of {} bytes each",
                rows.len(),
                ids.len(),
                t.row_bytes
            )));
        }
        if let Some(&id) = ids.iter().find(|&&id| id >= t.rows as u64) {
            return Err(self.refuse(format!("row {id} is past its {} rows", t.rows)));
        }
        if t.rows_per_block == 0 {
            return Err(self.refuse("its manifest gives 0 rows per block".into()));
        }
        let mut rows_at: Vec<(usize, usize, &[u8])> = ids
            .iter()
            .zip(rows.chunks_exact(t.row_bytes))
            .map(|(&id, row)| {
                let (block, in_block) = (
                    id as usize / t.rows_per_block,
                    id as usize % t.rows_per_block,
                );
                (block, in_block * t.row_bytes, row)
            })
            .collect();
        rows_at.sort_by_key(|r| r.0);
        let mut by_block: Vec<BlockRows<'_>> = Vec::new();
        for (block, offset, row) in rows_at {
            match by_block.last_mut() {
                Some((b, rows)) if *b == block => rows.push((offset, row)),
                _ => by_block.push((block, vec![(offset, row)])),
            }
        }
        Ok(by_block)
    }

    /// An error naming this table.
    fn refuse(&self, reason: String) -> EmbedError {
        EmbedError::remote_store(
            &self.model,
            self.version,
            format!("table '{}': {reason}", self.table.name),
        )
    }

    /// Bytes of block `b` as pushed.
    fn block_bytes(&self, b: usize) -> usize {
        self.table.block_rows(b).len() * self.table.row_bytes
    }

    /// Checks, before anything is written, that every block of `by_block` is in the store at
    /// its full length (on the primaries): a block a node lost (restarted without its data)
    /// must not be recreated by the write as zeros around the updated rows.
    fn check_blocks(&self, cluster: &mut Cluster, by_block: &[BlockRows<'_>]) -> Result<()> {
        let mut ops = Ops::default();
        for (block, _) in by_block {
            let key = format!("{}{block}", self.prefix);
            ops.push(key.as_bytes(), ember_redis::cmd("STRLEN").arg(&key));
        }
        let deadline = Instant::now() + cluster.options().timeout;
        let lens = cluster.run(&ops, false, deadline).map_err(store_error)?;
        let (mut missing, mut short) = (Vec::new(), Vec::new());
        for ((b, _), len) in by_block.iter().zip(&lens) {
            let want = self.block_bytes(*b);
            match len {
                Value::Int(n) if *n as usize == want => {}
                Value::Int(0) => missing.push(b.to_string()),
                Value::Int(n) => short.push(format!("block {b} holds {n} bytes, not {want}")),
                other => short.push(format!("block {b}: STRLEN answered {other:?}")),
            }
        }
        match missing.len() {
            0 => {}
            1 => short.insert(0, format!("block {} is missing", missing[0])),
            _ => short.insert(0, format!("blocks {} are missing", missing.join(", "))),
        }
        if short.is_empty() {
            return Ok(());
        }
        Err(EmbedError::UpdateRefused {
            model: self.model.clone(),
            version: self.version,
            table: self.table.name.clone(),
            found: short.join("; "),
        })
    }
}
