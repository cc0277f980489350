//! Streaming row updates: a producer writes new rows of a served version to the store and
//! publishes them on a Redis Stream per table; every server reads the streams and applies each
//! update to the rows it caches.
//!
//! The entry's format and its producer are the registry's (`ember_registry::updates`); this is
//! the servers' side: [`UpdateReader`] reads each table's stream from its position and hands
//! every entry over as an update ([`Polled`]), or as bad, or as a reset where its position was
//! trimmed away.

pub use crate::storage::updates::{EntryId, FollowedTable, Polled};
use ember_embed::{EmbedError, Result};
use ember_redis::Value;
use ember_redis::{Cluster, ClusterOptions, Ops};
use ember_registry::store_error;
use std::time::Instant;

use ember_registry::layout::updates_key;
use ember_registry::updates::{FIELD_IDS, FIELD_ROWS, FIELD_TS};

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
            cluster: Cluster::connect(opts.for_setup()).map_err(store_error)?,
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
                ops.push(
                    key.as_bytes(),
                    ember_redis::cmd("XINFO").arg("STREAM").arg(key),
                );
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

    /// Runs `ops` on the primaries: a table's `XINFO` and `XREAD` read one copy of its stream,
    /// the one its entries are written to first, so that a replica's lag never looks like a
    /// stream that went back (a reset).
    fn run(&mut self, ops: &Ops) -> Result<Vec<Value>> {
        let deadline = Instant::now() + self.cluster.options().timeout;
        self.cluster.run(ops, false, deadline).map_err(store_error)
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
                ember_redis::cmd("XINFO").arg("STREAM").arg(&t.key),
            );
            ops.push(
                t.key.as_bytes(),
                ember_redis::cmd("XREAD")
                    .arg("COUNT")
                    .arg(self.count)
                    .arg("STREAMS")
                    .arg(&t.key)
                    .arg(t.last.to_string()),
            );
        }
        let replies = match self.run(&ops) {
            Ok(r) => r,
            // XINFO fails on a stream that is gone (lost with a node that restarted without
            // its data): each such table is reset, and followed again once it is recreated.
            Err(e) => {
                return match self.vanished() {
                    Ok(v) if !v.is_empty() => Ok(v),
                    _ => Err(e),
                };
            }
        };
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
            // Or the stream went back (fewer entries ever added, or an older newest entry than
            // this reader read): it lost entries with a node (a failover to a replica that had
            // not copied them, a node restarted empty), and its rows may be older than those
            // this server applied.
            let trimmed = info.added.saturating_sub(t.seen) > info.length;
            if trimmed || info.added < t.seen || info.newest < t.last {
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

    /// After a failed poll: the tables whose stream existed and is gone now, each reset and
    /// followed from the start of the stream when it is created again.
    fn vanished(&mut self) -> Result<Vec<Polled>> {
        let gone: Vec<usize> = (0..self.tables.len())
            .filter(|&i| self.tables[i].exists)
            .collect();
        let mut ops = Ops::default();
        for &i in &gone {
            let key = &self.tables[i].key;
            ops.push(key.as_bytes(), ember_redis::cmd("EXISTS").arg(key));
        }
        let mut out = Vec::new();
        for (&i, v) in gone.iter().zip(self.run(&ops)?) {
            if matches!(v, Value::Int(0)) {
                let t = &mut self.tables[i];
                t.exists = false;
                t.last = EntryId::default();
                t.seen = 0;
                out.push(Polled::Reset {
                    table: i,
                    now_at: t.last,
                });
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
            ops.push(key.as_bytes(), ember_redis::cmd("EXISTS").arg(key));
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
    let (Some(ids), Some(rows)) = (get(FIELD_IDS), get(FIELD_ROWS)) else {
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
    let published_ms = get(FIELD_TS)
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
