//! How a model's tables are laid out in the cluster: every key, and the blocks rows are packed in.
//!
//! | key | type | what |
//! |---|---|---|
//! | `ember:models` | set | the names of the models pushed |
//! | `ember:<model>:versions` | hash | version number -> `pushing`, `ready` or `deleting` |
//! | `ember:<model>:served` | string | the version `ember registry promote` chose to serve (absent: the newest ready one) |
//! | `ember:<model>:v<N>:manifest` | string | the version's [`super::Manifest`] (JSON) |
//! | `ember:<model>:v<N>:config` | string | the model's `config.json`, as pushed |
//! | `ember:<model>:v<N>:dense` | string | its dense weights: a safetensors file of every tensor but the tables |
//! | `ember:<model>:v<N>:done` | hash | during a push: `<table>:<block>` -> CRC-32 of the block landed |
//! | `ember:<model>:v<N>:<table>:<block>` | string | rows `block x rpb .. (block + 1) x rpb` of the table, back to back |
//!
//! A table's rows are packed `rpb` (rows per block) to a string value, in Ember's own row
//! encoding; a row is read with `GETRANGE key offset offset + row_bytes - 1`. No key has a hash
//! tag, so blocks spread over every slot. `docs/remote-tier.md` has the measurements behind this
//! layout against a hash per partition (HPS, TFRA) and a key per row (DeepRec): within 1.01x of the
//! raw row bytes in `INFO memory`, where those take 1.48x and 1.54x for 256-byte rows.
//!
//! Block size: a value of `2^k - 16` bytes at most (k between 12 and 18), so that the value and
//! its header fill one of the allocator's size classes (a 256 KiB value would take a 320 KiB
//! allocation), and as large as keeps at least [`MIN_BLOCKS`] blocks per table, so that small
//! tables still spread over the nodes.

use ember_embed::{EmbedError, Result};

/// Largest block value, bytes (`2^18 - 16`).
pub const MAX_BLOCK_BYTES: usize = (1 << 18) - 16;
/// Blocks per table that the block size is chosen to reach where it can.
pub const MIN_BLOCKS: usize = 64;

/// Rows per block for a table of `rows` rows of `row_bytes` bytes.
pub fn rows_per_block(rows: usize, row_bytes: usize) -> usize {
    let row_bytes = row_bytes.max(1);
    let per = |k: u32| (((1usize << k) - 16) / row_bytes).max(1);
    (12..=18)
        .rev()
        .map(per)
        .find(|&rpb| rows.div_ceil(rpb) >= MIN_BLOCKS)
        .unwrap_or_else(|| per(12))
}

/// Whether `name` can be part of a key: 1 to 128 of `A-Z a-z 0-9 _ - .` (no `:` that separates
/// the parts of a key, no `{` that would make a hash tag).
pub fn check_name(what: &'static str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    match ok {
        true => Ok(()),
        false => Err(EmbedError::BadOption {
            option: what,
            reason: format!(
                "'{name}' cannot name a key in the store: use 1 to 128 of A-Z a-z 0-9 _ - ."
            ),
        }),
    }
}

/// The set of model names.
pub fn models_key() -> String {
    "ember:models".into()
}

/// A model's versions and their states.
pub fn versions_key(model: &str) -> String {
    format!("ember:{model}:versions")
}

/// A version's manifest.
pub fn manifest_key(model: &str, version: u64) -> String {
    format!("ember:{model}:v{version}:manifest")
}

/// The version a model's servers serve, once one was promoted.
pub fn served_key(model: &str) -> String {
    format!("ember:{model}:served")
}

/// A version's stored file: `config`, `dense` or `graph` (no block key ends so: theirs end in a
/// number).
pub fn file_key(model: &str, version: u64, file: &str) -> String {
    format!("ember:{model}:v{version}:{file}")
}

/// The blocks of a version landed so far during its push.
pub fn done_key(model: &str, version: u64) -> String {
    format!("ember:{model}:v{version}:done")
}

/// The set of a table's blocks that updates rewrote since the push (`ember registry verify` does
/// not hold them to the push's CRCs).
pub fn updated_key(model: &str, version: u64, table: &str) -> String {
    format!("ember:{model}:v{version}:{table}:updated")
}

/// The stream of a table's updates.
pub fn updates_key(model: &str, version: u64, table: &str) -> String {
    format!("ember:{model}:v{version}:{table}:updates")
}

/// The prefix of a table's block keys (append the block number).
pub fn block_prefix(model: &str, version: u64, table: &str) -> String {
    format!("ember:{model}:v{version}:{table}:")
}

/// State of a version in its model's `versions` hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionState {
    /// Being pushed: never served.
    Pushing,
    /// Pushed and verified: may be served.
    Ready,
    /// Being deleted: never served.
    Deleting,
}

impl VersionState {
    pub fn name(self) -> &'static str {
        match self {
            VersionState::Pushing => "pushing",
            VersionState::Ready => "ready",
            VersionState::Deleting => "deleting",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pushing" => Some(VersionState::Pushing),
            "ready" => Some(VersionState::Ready),
            "deleting" => Some(VersionState::Deleting),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_fit_a_size_class_and_spread_small_tables() {
        for (rows, rb) in [
            (500_000, 256),
            (500_000, 72),
            (1000, 256),
            (10, 4),
            (3, 1 << 20),
            (100_000, 36),
            (0, 8),
        ] {
            let rpb = rows_per_block(rows, rb);
            assert!(rpb >= 1);
            let bytes = rpb * rb;
            // One row larger than the largest block gets a block of its own.
            if rb <= MAX_BLOCK_BYTES {
                assert!(bytes <= MAX_BLOCK_BYTES, "{rows}x{rb}: {bytes}");
                let class = bytes.next_power_of_two();
                assert!(
                    bytes + 16 <= class,
                    "{rows}x{rb}: {bytes} spills over {class}"
                );
            }
            let blocks = rows.div_ceil(rpb);
            // Either enough blocks to spread, or already the smallest block (4 KiB).
            assert!(
                blocks >= MIN_BLOCKS.min(rows) || bytes + rb > (1 << 12) - 16 - rb,
                "{rows}x{rb}: {blocks} blocks of {rpb}"
            );
        }
        assert_eq!(rows_per_block(500_000, 256), 1023);
    }

    #[test]
    fn names_that_would_break_keys_are_refused() {
        assert!(check_name("model", "dlrm_v2-small.1").is_ok());
        for bad in ["", "a:b", "a{b}", "a b", "ü", &"x".repeat(129)] {
            assert!(check_name("model", bad).is_err(), "{bad}");
        }
    }
}
