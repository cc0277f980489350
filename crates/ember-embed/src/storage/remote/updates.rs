//! Streaming row updates: a producer writes new rows of a served version to the store and
//! publishes them on a Redis Stream per table; every server reads the streams and applies each
//! update to the rows it caches.
//!
//! | what | where |
//! |---|---|
//! | the rows | written into their blocks (`SETRANGE`) **before** the entry is published, so a server that misses a row after reading the entry fetches the new bytes |
//! | the entry | `XADD ember:<model>:v<N>:<table>:updates MAXLEN ~ <max> * ids <bytes> rows <bytes> ts <ms>` |
//! | `ids` | the rows' ids, unsigned 64-bit little-endian, back to back |
//! | `rows` | the rows in the table's own encoding ([`crate::DType`]: f32 / f16 / bf16 little-endian, int8 / int4 with their scale and bias), `row_bytes` each, in the order of `ids` |
//! | `ts` | the publisher's clock when it published, milliseconds since the Unix epoch (decimal): the update lag is measured from it |
//!
//! The stream's entry order is the order updates apply in: publish the updates of one table from
//! one producer (or serialize them), so that the last write to a row is the last entry, on the
//! store and on every server alike. A stream is trimmed to about `max_len` entries; a server whose
//! position was trimmed away (it fell behind) cannot tell which rows it missed, and drops its
//! cache of that table ([`Polled::Reset`]).

use super::layout::{self, block_prefix};
use super::manifest::ManifestTable;
use super::store::{read_manifest, resolve_version};
use crate::error::{EmbedError, Result};
pub use crate::storage::updates::{EntryId, FollowedTable, Polled};
use ember_redis::{Cluster, ClusterOptions, Ops};
use redis::Value;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Rows one entry carries at most (a producer splits larger updates).
pub const MAX_ENTRY_ROWS: usize = 1 << 16;

/// Entries a stream keeps about (`XADD ... MAXLEN ~`), by default.
pub const DEFAULT_MAX_LEN: usize = 100_000;

/// The stream of a table's updates.
pub fn updates_key(model: &str, version: u64, table: &str) -> String {
    format!("ember:{model}:v{version}:{table}:updates")
}

pub use super::layout::updated_key;

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
    pub fn publish(
        &self,
        cluster: &mut Cluster,
        ids: &[u64],
        rows: &[u8],
        max_len: usize,
    ) -> Result<PublishReport> {
        let t = &self.table;
        let bad = |reason: String| {
            EmbedError::remote_store(
                &self.model,
                self.version,
                format!("table '{}': {reason}", t.name),
            )
        };
        if ids.is_empty() || ids.len() > MAX_ENTRY_ROWS {
            return Err(bad(format!(
                "{} rows in one update: give 1 to {MAX_ENTRY_ROWS}",
                ids.len()
            )));
        }
        if rows.len() != ids.len() * t.row_bytes {
            return Err(bad(format!(
                "{} bytes of rows for {} ids of {} bytes each",
                rows.len(),
                ids.len(),
                t.row_bytes
            )));
        }
        if let Some(&id) = ids.iter().find(|&&id| id >= t.rows as u64) {
            return Err(bad(format!("row {id} is past its {} rows", t.rows)));
        }
        let mut ops = Ops::default();
        let mut blocks: Vec<usize> = ids
            .iter()
            .map(|&id| id as usize / t.rows_per_block)
            .collect();
        blocks.sort_unstable();
        blocks.dedup();
        let updated = updated_key(&self.model, self.version, &t.name);
        ops.push(
            updated.as_bytes(),
            redis::cmd("SADD").arg(&updated).arg(&blocks),
        );
        for (&id, row) in ids.iter().zip(rows.chunks_exact(t.row_bytes)) {
            let id = id as usize;
            let key = format!("{}{}", self.prefix, id / t.rows_per_block);
            let offset = (id % t.rows_per_block) * t.row_bytes;
            ops.push(
                key.as_bytes(),
                redis::cmd("SETRANGE").arg(&key).arg(offset).arg(row),
            );
        }
        let deadline = Instant::now() + cluster.options().timeout;
        cluster.run(&ops, false, deadline)?;
        let id_bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
        let mut ops = Ops::default();
        ops.push(
            self.key.as_bytes(),
            redis::cmd("XADD")
                .arg(&self.key)
                .arg("MAXLEN")
                .arg("~")
                .arg(max_len.max(1))
                .arg("*")
                .arg("ids")
                .arg(id_bytes)
                .arg("rows")
                .arg(rows)
                .arg("ts")
                .arg(now_ms()),
        );
        let deadline = Instant::now() + cluster.options().timeout;
        let entry = match cluster.run(&ops, false, deadline)?.pop() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(&b).into_owned(),
            other => return Err(bad(format!("XADD answered {other:?}"))),
        };
        Ok(PublishReport {
            version: self.version,
            rows: ids.len(),
            entry,
        })
    }
}

#[derive(Debug)]
struct Followed {
    table: FollowedTable,
    key: String,
    /// The last entry read (or, at start, the stream's last entry then), and how many entries
    /// the stream had ever been given up to it.
    last: EntryId,
    seen: u64,
    /// Whether the stream exists (it is created by the first update published).
    exists: bool,
}

/// Follows the update streams of a version's tables (see the module documentation): from the
/// newest entry at the time it is opened, so that a server that opens it before it reads any row
/// misses no update.
#[derive(Debug)]
pub struct UpdateReader {
    cluster: Cluster,
    model: String,
    version: u64,
    tables: Vec<Followed>,
    /// Entries read per table per poll at most.
    pub count: usize,
}

impl UpdateReader {
    /// Connects (its own connections) and takes each stream's newest entry as its position.
    pub fn open(
        opts: ClusterOptions,
        model: &str,
        version: u64,
        tables: Vec<FollowedTable>,
    ) -> Result<Self> {
        let mut r = UpdateReader {
            cluster: Cluster::connect(opts.for_setup())?,
            model: model.into(),
            version,
            tables: tables
                .into_iter()
                .map(|table| Followed {
                    key: updates_key(model, version, &table.name),
                    table,
                    last: EntryId::default(),
                    seen: 0,
                    exists: false,
                })
                .collect(),
            count: 16,
        };
        r.find_streams()?;
        let existing: Vec<usize> = (0..r.tables.len())
            .filter(|&i| r.tables[i].exists)
            .collect();
        if !existing.is_empty() {
            let mut ops = Ops::default();
            for &i in &existing {
                let key = &r.tables[i].key;
                ops.push(key.as_bytes(), redis::cmd("XINFO").arg("STREAM").arg(key));
            }
            for (&i, v) in existing.iter().zip(r.run(&ops)?) {
                let t = &mut r.tables[i];
                let info = StreamInfo::of(&v).ok_or_else(|| {
                    EmbedError::remote_store(
                        model,
                        version,
                        format!("{}: XINFO STREAM answered {v:?}", t.key),
                    )
                })?;
                t.last = info.newest;
                t.seen = info.added;
            }
        }
        r.cluster.set_timeout(opts.timeout);
        Ok(r)
    }

    fn run(&mut self, ops: &Ops) -> Result<Vec<Value>> {
        let deadline = Instant::now() + self.cluster.options().timeout;
        Ok(self.cluster.run(ops, true, deadline)?)
    }

    /// Whether any update was ever published for table `i` (before this reader opened, or
    /// since): its rows in the store may differ from those pushed.
    pub fn published(&self, i: usize) -> bool {
        self.tables[i].seen > 0
    }

    /// The position in each table's stream.
    pub fn positions(&self) -> Vec<EntryId> {
        self.tables.iter().map(|t| t.last).collect()
    }

    /// Reads what was published since the last poll (at most `count` entries per table), in
    /// stream order per table.
    pub fn poll(&mut self) -> Result<Vec<Polled>> {
        self.find_streams()?;
        let live: Vec<usize> = (0..self.tables.len())
            .filter(|&i| self.tables[i].exists)
            .collect();
        if live.is_empty() {
            return Ok(Vec::new());
        }
        let mut ops = Ops::default();
        for &i in &live {
            let t = &self.tables[i];
            ops.push(
                t.key.as_bytes(),
                redis::cmd("XINFO").arg("STREAM").arg(&t.key),
            );
            ops.push(
                t.key.as_bytes(),
                redis::cmd("XREAD")
                    .arg("COUNT")
                    .arg(self.count)
                    .arg("STREAMS")
                    .arg(&t.key)
                    .arg(t.last.to_string()),
            );
        }
        let replies = self.run(&ops)?;
        let mut out = Vec::new();
        for (&i, pair) in live.iter().zip(replies.chunks(2)) {
            let t = &mut self.tables[i];
            let Some(info) = StreamInfo::of(&pair[0]) else {
                return Err(EmbedError::remote_store(
                    &self.model,
                    self.version,
                    format!("{}: XINFO STREAM answered {:?}", t.key, pair[0]),
                ));
            };
            // Entries published after this reader's position, and those the stream still holds:
            // more of the first than of the second, and some were trimmed before it read them.
            if info.added.saturating_sub(t.seen) > info.length {
                t.last = info.newest;
                t.seen = info.added;
                out.push(Polled::Reset {
                    table: i,
                    now_at: info.newest,
                });
                continue;
            }
            for (entry, fields) in stream_entries(&pair[1]) {
                if entry <= t.last {
                    continue;
                }
                t.last = entry;
                t.seen += 1;
                out.push(parse_entry(i, &t.table, entry, &fields));
            }
        }
        Ok(out)
    }

    /// Notes which streams not seen yet exist now (`XINFO` fails on a missing key; a stream is
    /// created by the first update published to it).
    fn find_streams(&mut self) -> Result<()> {
        let missing: Vec<usize> = (0..self.tables.len())
            .filter(|&i| !self.tables[i].exists)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let mut ops = Ops::default();
        for &i in &missing {
            let key = &self.tables[i].key;
            ops.push(key.as_bytes(), redis::cmd("EXISTS").arg(key));
        }
        for (&i, v) in missing.iter().zip(self.run(&ops)?) {
            self.tables[i].exists = matches!(v, Value::Int(1));
        }
        Ok(())
    }

    /// The names of the tables followed, in order.
    pub fn tables(&self) -> Vec<String> {
        self.tables.iter().map(|t| t.table.name.clone()).collect()
    }

    /// The model and version followed.
    pub fn source(&self) -> (&str, u64) {
        (&self.model, self.version)
    }
}

/// What `XINFO STREAM` says of a stream: entries held, entries ever added, the newest id.
#[derive(Debug, Clone, Copy)]
struct StreamInfo {
    length: u64,
    added: u64,
    newest: EntryId,
}

impl StreamInfo {
    fn of(v: &Value) -> Option<StreamInfo> {
        let Value::Array(kv) = v else { return None };
        let field = |name: &str| {
            kv.chunks(2).find_map(|p| match &p[0] {
                Value::BulkString(k) if k == name.as_bytes() => p.get(1),
                _ => None,
            })
        };
        let int = |name: &str| match field(name)? {
            Value::Int(n) => u64::try_from(*n).ok(),
            _ => None,
        };
        let newest = match field("last-generated-id")? {
            Value::BulkString(b) => EntryId::parse(b)?,
            _ => return None,
        };
        Some(StreamInfo {
            length: int("length")?,
            added: int("entries-added")?,
            newest,
        })
    }
}

/// A stream entry's fields and their values.
type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// The entries of an `XREAD` reply on one stream: (id, field/value pairs).
fn stream_entries(v: &Value) -> Vec<(EntryId, Fields)> {
    let Value::Array(streams) = v else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for s in streams {
        let Value::Array(s) = s else { continue };
        let Some(Value::Array(entries)) = s.get(1) else {
            continue;
        };
        for e in entries {
            let Value::Array(e) = e else { continue };
            let (Some(Value::BulkString(id)), Some(Value::Array(kv))) = (e.first(), e.get(1))
            else {
                continue;
            };
            let Some(id) = EntryId::parse(id) else {
                continue;
            };
            let fields = kv
                .chunks(2)
                .filter_map(|p| match (&p[0], p.get(1)) {
                    (Value::BulkString(k), Some(Value::BulkString(v))) => {
                        Some((k.clone(), v.clone()))
                    }
                    _ => None,
                })
                .collect();
            out.push((id, fields));
        }
    }
    out
}

/// One entry of table `i` as an update, or why it is not one.
fn parse_entry(
    i: usize,
    t: &FollowedTable,
    entry: EntryId,
    fields: &[(Vec<u8>, Vec<u8>)],
) -> Polled {
    let get = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name.as_bytes())
            .map(|(_, v)| v)
    };
    let bad = |reason: String| Polled::Bad {
        table: i,
        entry,
        reason,
    };
    let (Some(ids), Some(rows)) = (get("ids"), get("rows")) else {
        return bad("no 'ids' or no 'rows' field".into());
    };
    if ids.len() % 8 != 0 || rows.len() != ids.len() / 8 * t.row_bytes {
        return bad(format!(
            "{} bytes of ids and {} bytes of rows: want 8 bytes per id and {} per row",
            ids.len(),
            rows.len(),
            t.row_bytes
        ));
    }
    let ids: Vec<u64> = ids
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect();
    if let Some(id) = ids.iter().find(|&&id| id >= t.rows as u64) {
        return bad(format!("row {id} is past the table's {} rows", t.rows));
    }
    let published_ms = get("ts")
        .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
        .unwrap_or(0);
    Polled::Rows {
        table: i,
        entry,
        ids,
        rows: rows.clone(),
        published_ms,
    }
}
