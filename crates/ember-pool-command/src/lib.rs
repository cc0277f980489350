//! `EMBER.POOL`: pooling next to the rows. One call to one node sums, for each bag of a batch,
//! the rows of that bag the node holds (weighted or not), and answers the partial sums, so that
//! a bag of 80 ids over three nodes costs three partial sums on the wire instead of 80 rows.
//!
//! This crate is the command's one definition, shared by both sides: the client (`ember-tier`'s
//! `RedisStore::pool`) builds calls with [`CallBuilder`], the Redis module
//! (`crates/ember-redis-module`, loaded with `redis-server --loadmodule`) parses them with
//! [`PoolCall::parse`] and sums with [`sum_bags`], and the client's own fallback for a node
//! without the module sums rows read with `GETRANGE` through the same [`add_row`]
//! ([`sum_rows`]). So a node's partial sums are the same bits whichever side computed them.
//!
//! It depends on `ember-embed` alone, for [`DType::decode_row`] (the kernels' own decoding): the
//! module links neither the tier nor the server.
//!
//! ```text
//! EMBER.POOL <prefix> <dtype> <dim> <rows_per_block> <blocks> <bags> <rows> [<weights>]
//!   prefix          the table's block-key prefix (`ember:<model>:v<N>:<table>:`, layout.rs)
//!   dtype           f32 | f16 | bf16 | int8 | int4 (the table's row encoding)
//!   dim             elements per row, 1 ..= MAX_DIM
//!   rows_per_block  rows packed per block (the manifest's)
//!   blocks          u32 LE block numbers, distinct, at most MAX_BLOCKS
//!   bags            u32 LE: the number of rows of each bag, at most MAX_BAGS bags
//!   rows            per row, in bag order: u32 LE index into `blocks`, u32 LE row in that block
//!   weights         f32 LE per row (a weighted sum); absent: every weight is 1
//! reply: a bulk string of bags x dim f32 LE, bag b's sum at b x dim; an empty bag sums to zeros
//! ```
//!
//! The sum of a bag: `acc = 0; for each row r of the bag, in order: acc[d] += w_r * x_r[d]`, in
//! f32, with rows decoded by [`DType::decode_row`] (the kernels' own decoding); no fused
//! multiply-add, so the bits depend only on the rows and their order.
//!
//! Errors ([`Refusal`]; the first word is the code a client matches): `BADCALL` for a malformed
//! call (it names the argument), `MISSING` for a block this node does not hold (never read as
//! zeros: the client reads those rows from the cluster instead), `SHORT` for a block shorter
//! than a row needs, `WRONGTYPE` for a key that is not a string, `BUG` for a panic caught in the
//! module. None is `ERR`: that code is Redis's own (an unknown command, a wrong arity), so a
//! client tells a node that runs no `EMBER.POOL` by the code alone ([`not_run_by_the_node`]).
use ember_embed::DType;

/// The command's name.
pub const COMMAND: &str = "EMBER.POOL";

/// A refusal's error code: the first word of the error reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalCode {
    /// The call is malformed: an argument out of range, arrays that disagree.
    BadCall,
    /// A block the call names is not on this node (moved, or lost with its shard).
    Missing,
    /// A block is shorter than a row the call reads from it needs.
    Short,
    /// A key the call names holds something other than a string.
    WrongType,
    /// The module panicked summing the call (a bug; the node keeps serving).
    Bug,
}

impl RefusalCode {
    /// Every code.
    pub const ALL: [RefusalCode; 5] = [
        RefusalCode::BadCall,
        RefusalCode::Missing,
        RefusalCode::Short,
        RefusalCode::WrongType,
        RefusalCode::Bug,
    ];

    /// The code as the reply spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalCode::BadCall => "BADCALL",
            RefusalCode::Missing => "MISSING",
            RefusalCode::Short => "SHORT",
            RefusalCode::WrongType => "WRONGTYPE",
            RefusalCode::Bug => "BUG",
        }
    }
}

/// Why a node refused a call: its code and what it says. Displayed as the module's error
/// reply: `CODE detail`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} {detail}", code.as_str())]
pub struct Refusal {
    pub code: RefusalCode,
    pub detail: String,
}

impl Refusal {
    /// A refusal with `code` saying `detail`.
    pub fn new(code: RefusalCode, detail: String) -> Refusal {
        Refusal { code, detail }
    }

    /// A malformed call: `detail` says what is wrong (after the command's name).
    fn bad_call(detail: String) -> Refusal {
        Refusal::new(RefusalCode::BadCall, format!("{COMMAND}: {detail}"))
    }
}

/// Whether an error reply with `code` (its first word) to a call of [`COMMAND`] is the node's
/// own refusal, before any module ran: `ERR` (an unknown command on a node without the module,
/// or a wrong arity from another version of it) or `NOPERM` (the caller's ACL user may not run
/// it). The module's own codes (see the module documentation) and the cluster's redirections
/// (`MOVED`, `ASK`, `TRYAGAIN`, ...) are not.
pub fn not_run_by_the_node(code: &str) -> bool {
    matches!(code, "ERR" | "NOPERM")
}

/// Largest `dim`.
pub const MAX_DIM: usize = 1 << 16;
/// Most distinct blocks one call names.
pub const MAX_BLOCKS: usize = 1 << 16;
/// Most bags one call sums.
pub const MAX_BAGS: usize = 1 << 20;
/// Most rows one call reads.
pub const MAX_ROWS: usize = 1 << 20;
/// Most elements one call adds (rows x dim): bounds a call's time on the node (about 0.1 s of
/// one core for f32 rows).
pub const MAX_WORK: usize = 1 << 27;
/// Most bytes of one call's reply (bags x dim x 4).
pub const MAX_REPLY: usize = 64 << 20;

/// One parsed call (borrowing its arguments).
#[derive(Debug, Clone, Copy)]
pub struct PoolCall<'a> {
    pub prefix: &'a [u8],
    pub dtype: DType,
    pub dim: usize,
    pub rows_per_block: usize,
    blocks: &'a [u8],
    bags: &'a [u8],
    rows: &'a [u8],
    weights: Option<&'a [u8]>,
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

fn number(what: &str, arg: &[u8], lo: usize, hi: usize) -> Result<usize, Refusal> {
    let n = std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .ok_or_else(|| {
            Refusal::bad_call(format!(
                "{what} is '{}', not a number",
                String::from_utf8_lossy(arg)
            ))
        })?;
    if !(lo..=hi).contains(&n) {
        return Err(Refusal::bad_call(format!(
            "{what} {n} is out of range {lo} ..= {hi}"
        )));
    }
    Ok(n)
}

fn words(what: &str, arg: &[u8], max: usize) -> Result<usize, Refusal> {
    if !arg.len().is_multiple_of(4) {
        return Err(Refusal::bad_call(format!(
            "{what} has {} bytes, not a whole number of 4-byte words",
            arg.len()
        )));
    }
    let n = arg.len() / 4;
    if n > max {
        return Err(Refusal::bad_call(format!(
            "{n} {what}, at most {max} per call"
        )));
    }
    Ok(n)
}

impl<'a> PoolCall<'a> {
    /// Parses a call's arguments (after the command's name), checking every bound and that the
    /// arrays agree with each other; block and row numbers are checked against the blocks when
    /// summing ([`sum_bags`]).
    pub fn parse(args: &[&'a [u8]]) -> Result<Self, Refusal> {
        if !(7..=8).contains(&args.len()) {
            return Err(Refusal::bad_call(format!(
                "{} arguments, expected 7 or 8: prefix dtype dim rows_per_block blocks bags rows [weights]",
                args.len()
            )));
        }
        let dtype = std::str::from_utf8(args[1])
            .ok()
            .and_then(|s| s.parse::<DType>().ok())
            .ok_or_else(|| {
                Refusal::bad_call(format!(
                    "dtype '{}' is not one of f32, f16, bf16, int8, int4",
                    String::from_utf8_lossy(args[1])
                ))
            })?;
        let dim = number("dim", args[2], 1, MAX_DIM)?;
        let rows_per_block = number("rows_per_block", args[3], 1, u32::MAX as usize)?;
        words("blocks", args[4], MAX_BLOCKS)?;
        let n_bags = words("bags", args[5], MAX_BAGS)?;
        let n_rows = words("rows", args[6], 2 * MAX_ROWS)? / 2;
        if !args[6].len().is_multiple_of(8) {
            return Err(Refusal::bad_call(format!(
                "rows has {} bytes, not a whole number of (block, row) pairs",
                args[6].len()
            )));
        }
        let counted: u64 = (0..n_bags).map(|b| u64::from(u32_at(args[5], b))).sum();
        if counted != n_rows as u64 {
            return Err(Refusal::bad_call(format!(
                "the bags count {counted} rows, rows has {n_rows}"
            )));
        }
        let weights = match args.get(7) {
            None => None,
            Some(w) => {
                if w.len() != 4 * n_rows {
                    return Err(Refusal::bad_call(format!(
                        "weights has {} bytes, expected 4 per row ({})",
                        w.len(),
                        4 * n_rows
                    )));
                }
                Some(*w)
            }
        };
        if n_rows.saturating_mul(dim) > MAX_WORK {
            return Err(Refusal::bad_call(format!(
                "{n_rows} rows of {dim} elements is over the {MAX_WORK} a call may add"
            )));
        }
        if n_bags.saturating_mul(dim).saturating_mul(4) > MAX_REPLY {
            return Err(Refusal::bad_call(format!(
                "{n_bags} bags of {dim} elements is over the {MAX_REPLY}-byte reply a call may have"
            )));
        }
        Ok(PoolCall {
            prefix: args[0],
            dtype,
            dim,
            rows_per_block,
            blocks: args[4],
            bags: args[5],
            rows: args[6],
            weights,
        })
    }

    pub fn n_blocks(&self) -> usize {
        self.blocks.len() / 4
    }

    pub fn n_bags(&self) -> usize {
        self.bags.len() / 4
    }

    /// Block `i`'s number.
    pub fn block(&self, i: usize) -> u32 {
        u32_at(self.blocks, i)
    }

    /// Block `i`'s key (`prefix` + its number) in `key` (cleared first).
    pub fn block_key(&self, i: usize, key: &mut Vec<u8>) {
        key.clear();
        key.extend_from_slice(self.prefix);
        key.extend_from_slice(self.block(i).to_string().as_bytes());
    }

    /// Bytes a reply of this call has.
    pub fn reply_bytes(&self) -> usize {
        self.n_bags() * self.dim * 4
    }
}

/// Adds `w x row` (encoded as `dtype`, decoded into `scratch`, `acc.len()` elements) to `acc`.
#[inline]
pub fn add_row(dtype: DType, row: &[u8], w: f32, acc: &mut [f32], scratch: &mut [f32]) {
    dtype.decode_row(row, scratch);
    if w == 1.0 {
        for (a, &x) in acc.iter_mut().zip(scratch.iter()) {
            *a += x;
        }
    } else {
        for (a, &x) in acc.iter_mut().zip(scratch.iter()) {
            *a += w * x;
        }
    }
}

/// The sums of `call`'s bags over `blocks` (the call's blocks' values, in its order; `None`: the
/// node has no such key), as the reply's bytes appended to `out` (cleared first). `scratch` is
/// reused from call to call: nothing is allocated per row.
pub fn sum_bags(
    call: &PoolCall<'_>,
    blocks: &[Option<&[u8]>],
    out: &mut Vec<u8>,
    scratch: &mut Vec<f32>,
) -> Result<(), Refusal> {
    let (dim, dtype) = (call.dim, call.dtype);
    let row_bytes = dtype.row_bytes(dim);
    if blocks.len() != call.n_blocks() {
        return Err(Refusal::bad_call(format!(
            "{} block values for {} blocks",
            blocks.len(),
            call.n_blocks()
        )));
    }
    scratch.clear();
    scratch.resize(2 * dim, 0.0);
    let (acc, row) = scratch.split_at_mut(dim);
    out.clear();
    out.reserve(call.reply_bytes());
    let mut r = 0usize;
    for b in 0..call.n_bags() {
        acc.fill(0.0);
        for _ in 0..u32_at(call.bags, b) {
            let (bi, in_block) = (
                u32_at(call.rows, 2 * r) as usize,
                u32_at(call.rows, 2 * r + 1) as usize,
            );
            if bi >= blocks.len() {
                return Err(Refusal::bad_call(format!(
                    "row {r} names block index {bi}, the call has {} blocks",
                    blocks.len()
                )));
            }
            if in_block >= call.rows_per_block {
                return Err(Refusal::bad_call(format!(
                    "row {r} is row {in_block} of its block, which holds {}",
                    call.rows_per_block
                )));
            }
            let Some(value) = blocks[bi] else {
                let mut key = Vec::new();
                call.block_key(bi, &mut key);
                return Err(Refusal::new(
                    RefusalCode::Missing,
                    format!(
                        "block {} is not on this node",
                        String::from_utf8_lossy(&key)
                    ),
                ));
            };
            let start = in_block * row_bytes;
            let Some(bytes) = value.get(start..start + row_bytes) else {
                let mut key = Vec::new();
                call.block_key(bi, &mut key);
                return Err(Refusal::new(
                    RefusalCode::Short,
                    format!(
                        "block {} has {} bytes, row {in_block} needs {}",
                        String::from_utf8_lossy(&key),
                        value.len(),
                        start + row_bytes
                    ),
                ));
            };
            let w = match call.weights {
                Some(ws) => {
                    f32::from_le_bytes([ws[4 * r], ws[4 * r + 1], ws[4 * r + 2], ws[4 * r + 3]])
                }
                None => 1.0,
            };
            add_row(dtype, bytes, w, acc, row);
            r += 1;
        }
        for x in acc.iter() {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    Ok(())
}

/// `out` = each bag (`bags[b]` rows) summed in order over `row(k)` (the `k`-th row, weighted by
/// `weights[k]` when given), `dtype` rows of `dim` elements.
pub fn sum_rows<'r>(
    dtype: DType,
    dim: usize,
    bags: &[u32],
    weights: Option<&[f32]>,
    out: &mut Vec<f32>,
    scratch: &mut Vec<f32>,
    row: impl Fn(usize) -> &'r [u8],
) {
    out.clear();
    out.resize(bags.len() * dim, 0.0);
    scratch.resize(dim, 0.0);
    let mut k = 0;
    for (acc, &n) in out.chunks_exact_mut(dim).zip(bags) {
        for _ in 0..n {
            let w = weights.map_or(1.0, |w| w[k]);
            add_row(dtype, row(k), w, acc, scratch);
            k += 1;
        }
    }
}

/// A call being built by the client: one table's rows on one node.
#[derive(Debug, Default, Clone)]
pub struct CallBuilder {
    blocks: Vec<u8>,
    bags: Vec<u8>,
    rows: Vec<u8>,
    weights: Vec<u8>,
    /// Block number -> its index in `blocks`, for the blocks met so far.
    index: std::collections::HashMap<u32, u32>,
    /// The open bag's count (the last entry of `bags` once closed).
    open: u32,
}

impl CallBuilder {
    /// Adds row `in_block` of block `block` (weight `w`) to the open bag.
    pub fn row(&mut self, block: u32, in_block: u32, w: Option<f32>) {
        let next = self.index.len() as u32;
        let bi = *self.index.entry(block).or_insert_with(|| {
            self.blocks.extend_from_slice(&block.to_le_bytes());
            next
        });
        self.rows.extend_from_slice(&bi.to_le_bytes());
        self.rows.extend_from_slice(&in_block.to_le_bytes());
        if let Some(w) = w {
            self.weights.extend_from_slice(&w.to_le_bytes());
        }
        self.open += 1;
    }

    /// Closes the open bag (an empty one too).
    pub fn end_bag(&mut self) {
        self.bags.extend_from_slice(&self.open.to_le_bytes());
        self.open = 0;
    }

    pub fn n_bags(&self) -> usize {
        self.bags.len() / 4
    }

    /// Rows per closed bag.
    pub fn bag_counts(&self) -> Vec<u32> {
        (0..self.n_bags()).map(|b| u32_at(&self.bags, b)).collect()
    }

    /// The call's arguments after the command's name (`weighted`: send the weights).
    pub fn args<'a>(
        &'a self,
        prefix: &'a [u8],
        dtype: &'a str,
        dim: &'a str,
        rows_per_block: &'a str,
        weighted: bool,
    ) -> Vec<&'a [u8]> {
        let mut a: Vec<&[u8]> = vec![
            prefix,
            dtype.as_bytes(),
            dim.as_bytes(),
            rows_per_block.as_bytes(),
            &self.blocks,
            &self.bags,
            &self.rows,
        ];
        if weighted {
            a.push(&self.weights);
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    /// A table of `rows` random rows, packed `rpb` to a block, as `ember store push` packs them.
    fn blocks_of(
        dtype: DType,
        dim: usize,
        rows: usize,
        rpb: usize,
        rng: &mut StdRng,
    ) -> Vec<Vec<u8>> {
        let rb = dtype.row_bytes(dim);
        let mut blocks = vec![Vec::new(); rows.div_ceil(rpb)];
        let mut row = vec![0f32; dim];
        let mut enc = vec![0u8; rb];
        for r in 0..rows {
            row.iter_mut()
                .for_each(|x| *x = rng.random_range(-1.0..1.0));
            dtype.encode_row(&row, &mut enc);
            blocks[r / rpb].extend_from_slice(&enc);
        }
        blocks
    }

    #[test]
    fn a_call_sums_each_bag_as_the_plain_reference_does() {
        let mut rng = StdRng::seed_from_u64(45);
        for dtype in DType::ALL {
            for (dim, rows, rpb) in [(1, 5, 2), (7, 40, 3), (16, 100, 16), (33, 9, 9)] {
                let blocks = blocks_of(dtype, dim, rows, rpb, &mut rng);
                let rb = dtype.row_bytes(dim);
                for weighted in [false, true] {
                    // Bags of 0 to 6 rows (repeats allowed), over every block.
                    let bags: Vec<Vec<(usize, f32)>> = (0..rng.random_range(1..8))
                        .map(|_| {
                            (0..rng.random_range(0..7))
                                .map(|_| (rng.random_range(0..rows), rng.random_range(-2.0..2.0)))
                                .collect()
                        })
                        .collect();
                    let mut call = CallBuilder::default();
                    for bag in &bags {
                        for &(id, w) in bag {
                            call.row((id / rpb) as u32, (id % rpb) as u32, weighted.then_some(w));
                        }
                        call.end_bag();
                    }
                    let (d, r) = (dim.to_string(), rpb.to_string());
                    let args = call.args(b"p:", dtype.name(), &d, &r, weighted);
                    let parsed = PoolCall::parse(&args).unwrap();
                    let values: Vec<Option<&[u8]>> = (0..parsed.n_blocks())
                        .map(|i| Some(blocks[parsed.block(i) as usize].as_slice()))
                        .collect();
                    let (mut out, mut scratch) = (Vec::new(), Vec::new());
                    sum_bags(&parsed, &values, &mut out, &mut scratch).unwrap();
                    assert_eq!(out.len(), bags.len() * dim * 4);
                    let mut x = vec![0f32; dim];
                    for (b, bag) in bags.iter().enumerate() {
                        let mut want = vec![0f64; dim];
                        for &(id, w) in bag {
                            let row = &blocks[id / rpb][(id % rpb) * rb..][..rb];
                            dtype.decode_row(row, &mut x);
                            let w = if weighted { w } else { 1.0 };
                            want.iter_mut()
                                .zip(&x)
                                .for_each(|(a, &v)| *a += f64::from(w) * f64::from(v));
                        }
                        for (k, want) in want.iter().enumerate() {
                            let at = 4 * (b * dim + k);
                            let got = f32::from_le_bytes(out[at..at + 4].try_into().unwrap());
                            let tol = 1e-5 * (1.0 + bag.len() as f64) * 2.0;
                            assert!(
                                (f64::from(got) - want).abs() <= tol,
                                "{dtype} dim {dim} bag {b}[{k}]: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn malformed_calls_are_refused_naming_what_is_wrong() {
        let blocks = 7u32.to_le_bytes();
        let bags = 1u32.to_le_bytes();
        let mut rows = Vec::new();
        rows.extend_from_slice(&0u32.to_le_bytes());
        rows.extend_from_slice(&3u32.to_le_bytes());
        let ok: Vec<&[u8]> = vec![b"p:", b"f32", b"4", b"10", &blocks, &bags, &rows];
        assert!(PoolCall::parse(&ok).is_ok());
        let cases: Vec<(usize, &[u8], &str)> = vec![
            (1, b"f64", "dtype"),
            (2, b"0", "dim"),
            (2, b"x", "dim"),
            (2, b"70000", "dim"),
            (3, b"0", "rows_per_block"),
            (4, b"\x01\x02\x03", "blocks"),
            (5, b"\x02\x00\x00\x00", "count 2 rows"),
            (6, b"\x00\x00\x00\x00", "rows"),
        ];
        for (i, bad, says) in cases {
            let mut a = ok.clone();
            a[i] = bad;
            let e = PoolCall::parse(&a).unwrap_err();
            assert_eq!(e.code, RefusalCode::BadCall, "{e}");
            assert!(e.to_string().starts_with("BADCALL EMBER.POOL: ") && e.detail.contains(says));
        }
        assert!(
            PoolCall::parse(&ok[..5])
                .unwrap_err()
                .detail
                .contains("arguments")
        );
        let mut w = ok.clone();
        w.push(b"\x00\x00");
        assert!(PoolCall::parse(&w).unwrap_err().detail.contains("weights"));
        // Bounds checked against the blocks: a block index or a row out of range, a block
        // missing or short.
        let call = PoolCall::parse(&ok).unwrap();
        let (mut out, mut s) = (Vec::new(), Vec::new());
        let full = vec![0u8; 160];
        assert!(sum_bags(&call, &[Some(&full)], &mut out, &mut s).is_ok());
        let e = sum_bags(&call, &[None], &mut out, &mut s).unwrap_err();
        assert_eq!(e.code, RefusalCode::Missing);
        assert_eq!(e.to_string(), "MISSING block p:7 is not on this node");
        let e = sum_bags(&call, &[Some(&full[..40])], &mut out, &mut s).unwrap_err();
        assert_eq!(e.code, RefusalCode::Short);
        assert!(
            e.to_string().starts_with("SHORT block p:7 has 40 bytes"),
            "{e}"
        );
        let mut far = rows.clone();
        far[4..8].copy_from_slice(&10u32.to_le_bytes());
        let a: Vec<&[u8]> = vec![b"p:", b"f32", b"4", b"10", &blocks, &bags, &far];
        let e = sum_bags(
            &PoolCall::parse(&a).unwrap(),
            &[Some(&full)],
            &mut out,
            &mut s,
        );
        assert!(e.unwrap_err().detail.contains("holds 10"));
        let mut other = rows.clone();
        other[0..4].copy_from_slice(&1u32.to_le_bytes());
        let a: Vec<&[u8]> = vec![b"p:", b"f32", b"4", b"10", &blocks, &bags, &other];
        let e = sum_bags(
            &PoolCall::parse(&a).unwrap(),
            &[Some(&full)],
            &mut out,
            &mut s,
        );
        assert!(e.unwrap_err().detail.contains("block index 1"));
    }

    #[test]
    fn work_and_reply_are_bounded() {
        let bags = vec![0u8; 4 * 1024];
        let a: Vec<&[u8]> = vec![b"p:", b"f32", b"65536", b"1", b"", &bags, b""];
        assert!(PoolCall::parse(&a).unwrap_err().detail.contains("reply"));
        let many = vec![0u8; 4 * (MAX_BLOCKS + 1)];
        let a: Vec<&[u8]> = vec![b"p:", b"f32", b"4", b"1", &many, b"", b""];
        assert!(PoolCall::parse(&a).unwrap_err().detail.contains("at most"));
    }

    /// A client reads `ERR` and `NOPERM` as a node that runs no `EMBER.POOL` (and reads its
    /// rows whole), and every code of the module's own, or of the cluster's redirections, as a
    /// refusal of the call: the module never answers with Redis's codes.
    #[test]
    fn the_modules_codes_are_never_the_nodes_own() {
        for code in RefusalCode::ALL {
            assert!(!not_run_by_the_node(code.as_str()), "{code:?}");
            let e = Refusal::new(code, "x".into()).to_string();
            assert_eq!(e.split(' ').next(), Some(code.as_str()));
        }
        for redirect in ["MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "CROSSSLOT"] {
            assert!(!not_run_by_the_node(redirect));
        }
        assert!(not_run_by_the_node("ERR") && not_run_by_the_node("NOPERM"));
    }
}
