//! The history cache's second tier: entries evicted from DRAM are written to files on a disk
//! (one per user, checksummed), bounded in bytes (least recently spilled first), and read back
//! when their user returns. A file that is missing, short, or fails its checksum or its shape is
//! deleted and its user recomputed, never served.
//!
//! Each cache writes under a directory of its own (`DIR/ember-history-<pid>-<n>/`), removed
//! with the cache: two versions of a model serving side by side never share files, and a
//! restarted server never reads entries of a process (and model) that is gone.
//!
//! File layout (little-endian): `EMBHIST1`, key, history, fingerprint, the epochs (count,
//! values), the segments (count; per segment tokens, its request's history, candidates and
//! query time, values); the segments' values (f32); a CRC-32 of everything before it.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::entry::{Entry, Segment};
use super::plan::AsOf;

const MAGIC: &[u8; 8] = b"EMBHIST1";

/// Why a spilled entry was not read back.
#[derive(Debug, thiserror::Error)]
pub enum Damaged {
    #[error("reading spilled entry {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("spilled entry {path} is damaged: {reason}")]
    Bad { path: PathBuf, reason: &'static str },
}

#[derive(Debug, Default)]
struct Index {
    /// Key -> (bytes, rank).
    map: HashMap<u64, (u64, u64)>,
    order: BTreeMap<u64, u64>,
    bytes: u64,
    clock: u64,
}

/// A cache's spill directory.
#[derive(Debug)]
pub(crate) struct Spill {
    dir: PathBuf,
    bytes: u64,
    index: Mutex<Index>,
}

static SPILLS: AtomicU64 = AtomicU64::new(0);

impl Spill {
    /// A directory of its own under `parent`, holding at most `bytes`.
    pub fn open(parent: &Path, bytes: u64) -> io::Result<Spill> {
        let n = SPILLS.fetch_add(1, Ordering::Relaxed);
        let dir = parent.join(format!("ember-history-{}-{n}", std::process::id()));
        fs::create_dir_all(&dir)?;
        Ok(Spill {
            dir,
            bytes,
            index: Mutex::default(),
        })
    }

    fn path(&self, key: u64) -> PathBuf {
        self.dir.join(format!("{key:016x}.hist"))
    }

    /// Bytes on disk now.
    pub fn held(&self) -> u64 {
        self.index.lock().unwrap_or_else(|p| p.into_inner()).bytes
    }

    /// Writes `entry` for `key` (replacing its file), deleting the least recently spilled
    /// files to stay within the bound; returns how many it deleted.
    pub fn put(&self, key: u64, entry: &Entry) -> io::Result<u64> {
        let size = encoded_len(entry);
        if size > self.bytes {
            self.forget(key);
            return Ok(0);
        }
        let tmp = self.dir.join(format!("{key:016x}.tmp"));
        encode(key, entry, fs::File::create(&tmp)?)?;
        fs::rename(&tmp, self.path(key))?;
        let mut g = self.index.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((b, r)) = g.map.remove(&key) {
            g.order.remove(&r);
            g.bytes -= b;
        }
        let mut dropped = 0;
        while g.bytes + size > self.bytes {
            let Some((_, victim)) = g.order.pop_first() else {
                break;
            };
            let (b, _) = g.map.remove(&victim).expect("indexed");
            g.bytes -= b;
            let _ = fs::remove_file(self.path(victim));
            dropped += 1;
        }
        g.clock += 1;
        let rank = g.clock;
        g.order.insert(rank, key);
        g.map.insert(key, (size, rank));
        g.bytes += size;
        Ok(dropped)
    }

    /// The entry spilled for `key`, read back and its file deleted (`None`: none spilled).
    pub fn take(&self, key: u64) -> Result<Option<Entry>, Damaged> {
        if !self.forget(key) {
            return Ok(None);
        }
        let path = self.path(key);
        let read = (|| {
            let mut buf = Vec::new();
            fs::File::open(&path)?.read_to_end(&mut buf)?;
            Ok(buf)
        })();
        let _ = fs::remove_file(&path);
        let buf = read.map_err(|source| Damaged::Io {
            path: path.clone(),
            source,
        })?;
        decode(key, &buf)
            .map(Some)
            .map_err(|reason| Damaged::Bad { path, reason })
    }

    /// Drops `key` from the index; whether it was there.
    fn forget(&self, key: u64) -> bool {
        let mut g = self.index.lock().unwrap_or_else(|p| p.into_inner());
        match g.map.remove(&key) {
            Some((b, r)) => {
                g.order.remove(&r);
                g.bytes -= b;
                true
            }
            None => false,
        }
    }
}

impl Drop for Spill {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Bytes of `entry`'s file.
fn encoded_len(entry: &Entry) -> u64 {
    let values: usize = entry.segments.iter().map(|s| s.kv.len()).sum();
    (8 + 8 * (3 + 1 + entry.epochs.len() + 1 + 5 * entry.segments.len()) + 4 * values + 4) as u64
}

/// A writer that keeps the CRC-32 of what it wrote.
struct Summed<W: Write> {
    out: W,
    crc: crc32fast::Hasher,
}

impl<W: Write> Summed<W> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.crc.update(bytes);
        self.out.write_all(bytes)
    }

    fn u64(&mut self, v: u64) -> io::Result<()> {
        self.put(&v.to_le_bytes())
    }
}

/// Writes `entry`'s file to `out`, streamed: the values are not copied into one buffer first.
fn encode(key: u64, entry: &Entry, out: impl Write) -> io::Result<()> {
    let mut w = Summed {
        out: io::BufWriter::with_capacity(1 << 20, out),
        crc: crc32fast::Hasher::new(),
    };
    w.put(MAGIC)?;
    for v in [key, entry.history as u64, entry.fingerprint] {
        w.u64(v)?;
    }
    w.u64(entry.epochs.len() as u64)?;
    for &e in &entry.epochs {
        w.u64(e)?;
    }
    w.u64(entry.segments.len() as u64)?;
    for s in &entry.segments {
        let a = s.as_of;
        for v in [s.tokens as u64, a.history as u64, a.candidates as u64] {
            w.u64(v)?;
        }
        w.u64(a.query as u64)?;
        w.u64(s.kv.len() as u64)?;
    }
    let mut chunk = Vec::with_capacity(1 << 16);
    for s in &entry.segments {
        for part in s.kv.chunks(1 << 14) {
            chunk.clear();
            chunk.extend(part.iter().flat_map(|v| v.to_le_bytes()));
            w.put(&chunk)?;
        }
    }
    let crc = w.crc.finalize();
    w.out.write_all(&crc.to_le_bytes())?;
    w.out.flush()
}

/// A reader of a file's fields, each bounds-checked.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn u64(&mut self) -> Result<u64, &'static str> {
        let (head, rest) = self.0.split_at_checked(8).ok_or("short")?;
        self.0 = rest;
        Ok(u64::from_le_bytes(head.try_into().expect("8 bytes")))
    }

    fn count(&mut self, most: u64) -> Result<usize, &'static str> {
        let n = self.u64()?;
        (n <= most)
            .then_some(n as usize)
            .ok_or("a count past the file's size")
    }
}

/// `buf` checked against its trailing CRC-32 and its leading `magic`: its body (checksum
/// off) and what follows the magic; `other` names a buffer of another magic.
pub(super) fn checked<'a>(
    buf: &'a [u8],
    magic: &[u8; 8],
    other: &'static str,
) -> Result<(&'a [u8], &'a [u8]), &'static str> {
    let (body, crc) = buf
        .split_at_checked(buf.len().saturating_sub(4))
        .ok_or("short")?;
    if crc.len() != 4 || crc32fast::hash(body).to_le_bytes() != crc {
        return Err("checksum mismatch");
    }
    let (head, rest) = body.split_at_checked(8).ok_or("short")?;
    if head != magic {
        return Err(other);
    }
    Ok((body, rest))
}

/// The entry of a file's bytes, checked: magic, key, checksum, and every length.
fn decode(key: u64, buf: &[u8]) -> Result<Entry, &'static str> {
    let (body, rest) = checked(buf, MAGIC, "not a spilled history entry")?;
    let mut f = Fields(rest);
    if f.u64()? != key {
        return Err("another user's entry");
    }
    let history = f.u64()? as usize;
    let fingerprint = f.u64()?;
    let most = body.len() as u64 / 8;
    let epochs = (0..f.count(most)?)
        .map(|_| f.u64())
        .collect::<Result<Vec<_>, _>>()?;
    let n = f.count(most)?;
    let mut heads = Vec::with_capacity(n);
    for _ in 0..n {
        let (tokens, h, c) = (f.u64()? as usize, f.u64()? as usize, f.u64()? as usize);
        let query = f.u64()? as i64;
        heads.push((
            tokens,
            AsOf {
                history: h,
                candidates: c,
                query,
            },
            f.count(body.len() as u64 / 4)?,
        ));
    }
    let mut values = f.0;
    let mut segments = Vec::with_capacity(n);
    for (tokens, as_of, len) in heads {
        let (v, rest) = values.split_at_checked(len * 4).ok_or("short values")?;
        values = rest;
        let kv = v
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect();
        segments.push(Arc::new(Segment { tokens, as_of, kv }));
    }
    if !values.is_empty() {
        return Err("trailing bytes");
    }
    Ok(Entry {
        history,
        fingerprint,
        epochs,
        segments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        crate::hstu::entry::fixtures::entry(&[(5, 4, 0.5), (3, 7, -1.25)], 600, -5)
    }

    fn same(a: &Entry, b: &Entry) {
        assert_eq!(
            (a.history, a.fingerprint, &a.epochs),
            (b.history, b.fingerprint, &b.epochs)
        );
        assert_eq!(a.segments.len(), b.segments.len());
        for (x, y) in a.segments.iter().zip(&b.segments) {
            assert_eq!((x.tokens, x.as_of, &x.kv), (y.tokens, y.as_of, &y.kv));
        }
    }

    #[test]
    fn an_entry_reads_back_as_written_and_a_damaged_one_is_refused() {
        let e = entry();
        let mut bytes = Vec::new();
        encode(9, &e, &mut bytes).unwrap();
        assert_eq!(bytes.len() as u64, encoded_len(&e));
        same(&decode(9, &bytes).unwrap(), &e);
        assert_eq!(decode(8, &bytes).unwrap_err(), "another user's entry");
        for at in [0, 9, 40, bytes.len() / 2, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert_eq!(
                decode(9, &bad).unwrap_err(),
                "checksum mismatch",
                "byte {at}"
            );
        }
        for cut in [0, 3, 12, bytes.len() - 5] {
            assert!(decode(9, &bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn spilled_entries_are_bounded_taken_once_and_damage_is_named() {
        let dir = std::env::temp_dir();
        let size = encoded_len(&entry());
        let s = Spill::open(&dir, 2 * size).unwrap();
        assert_eq!(s.put(1, &entry()).unwrap(), 0);
        assert_eq!(s.put(2, &entry()).unwrap(), 0);
        // A third deletes the least recently spilled.
        assert_eq!(s.put(3, &entry()).unwrap(), 1);
        assert!(s.take(1).unwrap().is_none());
        assert_eq!(s.held(), 2 * size);
        same(&s.take(2).unwrap().unwrap(), &entry());
        assert!(s.take(2).unwrap().is_none(), "taken once");
        // A file damaged on disk: refused naming it, and gone.
        let path = s.path(3);
        let mut bytes = fs::read(&path).unwrap();
        bytes[20] ^= 1;
        fs::write(&path, bytes).unwrap();
        let e = s.take(3).unwrap_err().to_string();
        assert!(
            e.contains("checksum mismatch") && e.contains(".hist"),
            "{e}"
        );
        assert!(!path.exists());
        // A file deleted behind its back: an I/O error, not a panic.
        s.put(4, &entry()).unwrap();
        fs::remove_file(s.path(4)).unwrap();
        assert!(matches!(s.take(4), Err(Damaged::Io { .. })));
        let d = s.dir.clone();
        drop(s);
        assert!(!d.exists(), "the directory goes with the cache");
    }
}
