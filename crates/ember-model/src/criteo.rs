//! The Criteo Kaggle / Terabyte TSV format: a 0/1 label, 13 integer features and 26 categorical
//! features (hex strings), tab-separated. See `docs/model-format.md` for how Ember reads it:
//! empty integers are 0, negative ones are clipped to 0 and the dense input is `ln(x + 1)`; an empty
//! categorical is 0, otherwise `int(hex, 16)`, hashed `mod rows` when a batch is built (dlrm's
//! `--max-ind-range`); missing trailing fields read as empty.

use std::io::{BufRead, Read};

use ember_embed::files::LINE_LIMIT;
use ember_embed::{Ids, KeyedJagged};

use crate::error::{ModelError, Result};

/// Integer columns.
pub const DENSE: usize = 13;
/// Categorical columns.
pub const SPARSE: usize = 26;
/// Fields of a full row.
pub const FIELDS: usize = 1 + DENSE + SPARSE;

/// Parsed rows, sample-major.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct CriteoBatch {
    pub labels: Vec<f32>,
    /// `[B, 13]`: `ln(max(x, 0) + 1)`.
    pub dense: Vec<f32>,
    /// `[B, 26]`: the categorical values before hashing.
    pub cats: Vec<u64>,
}

impl CriteoBatch {
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    pub fn clear(&mut self) {
        self.labels.clear();
        self.dense.clear();
        self.cats.clear();
    }

    /// The sparse features of the batch: feature `f` (named `names[f]`) gets one id per sample,
    /// column `C(f+1)` hashed modulo `rows[f]`.
    pub fn sparse(&self, names: &[String], rows: &[usize]) -> Result<KeyedJagged> {
        if names.len() != SPARSE || rows.len() != SPARSE {
            return Err(ModelError::Input(format!(
                "Criteo data has {SPARSE} categorical columns but the model has {} sparse features",
                names.len()
            )));
        }
        let b = self.len();
        let wide = rows.iter().any(|&r| r > u32::MAX as usize);
        let id = |s: usize, f: usize| self.cats[s * SPARSE + f] % rows[f] as u64;
        let ids = if wide {
            Ids::I64(
                (0..SPARSE)
                    .flat_map(|f| (0..b).map(move |s| id(s, f) as i64))
                    .collect(),
            )
        } else {
            Ids::U32(
                (0..SPARSE)
                    .flat_map(|f| (0..b).map(move |s| id(s, f) as u32))
                    .collect(),
            )
        };
        Ok(KeyedJagged::from_lengths(
            names.to_vec(),
            b,
            &vec![1; SPARSE * b],
            ids,
            None,
        )?)
    }
}

/// Parses one line (without its newline) and appends it to `out`. `line_no` and `source` only
/// name the line in errors. On error `out` is unchanged.
pub fn parse_line(line: &str, source: &str, line_no: u64, out: &mut CriteoBatch) -> Result<()> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    let err = |column: usize, reason: String| ModelError::Criteo {
        source_name: source.to_string(),
        line: line_no,
        column,
        reason,
    };
    let mut fields = [""; FIELDS];
    for (n, f) in line.split('\t').enumerate() {
        if n == FIELDS {
            return Err(err(
                FIELDS + 1,
                format!(
                    "more than {FIELDS} fields ({} found)",
                    line.split('\t').count()
                ),
            ));
        }
        fields[n] = f;
    }
    let label = match fields[0] {
        "0" => 0.0,
        "1" => 1.0,
        "" => return Err(err(1, "the label is empty (expected 0 or 1)".into())),
        s => return Err(err(1, format!("label '{}' is not 0 or 1", short(s)))),
    };
    let mut dense = [0f32; DENSE];
    for (k, d) in dense.iter_mut().enumerate() {
        let s = fields[1 + k];
        let x: i64 = if s.is_empty() {
            0
        } else {
            s.parse().map_err(|_| {
                err(
                    2 + k,
                    format!(
                        "integer feature I{} is '{}', not an integer",
                        k + 1,
                        short(s)
                    ),
                )
            })?
        };
        *d = (x.max(0) as f32 + 1.0).ln();
    }
    let mut cats = [0u64; SPARSE];
    for (k, c) in cats.iter_mut().enumerate() {
        let s = fields[1 + DENSE + k];
        if !s.is_empty() {
            if s.len() > 16 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(err(
                    2 + DENSE + k,
                    format!(
                        "categorical feature C{} is '{}', not a hex value of at most 16 digits",
                        k + 1,
                        short(s)
                    ),
                ));
            }
            *c = u64::from_str_radix(s, 16).expect("checked hex digits");
        }
    }
    out.labels.push(label);
    out.dense.extend_from_slice(&dense);
    out.cats.extend_from_slice(&cats);
    Ok(())
}

fn short(s: &str) -> String {
    if s.len() <= 24 {
        s.to_string()
    } else {
        let cut = (0..=24).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
        format!("{}...", &s[..cut])
    }
}

/// Streams batches from a Criteo TSV source.
#[derive(Debug)]
pub struct CriteoReader<R> {
    inner: R,
    source: String,
    line_no: u64,
    bytes: u64,
    buf: String,
}

impl<R: BufRead> CriteoReader<R> {
    /// `source` names the input in errors (a path, or `stdin`).
    pub fn new(inner: R, source: impl Into<String>) -> Self {
        CriteoReader {
            inner,
            source: source.into(),
            line_no: 0,
            bytes: 0,
            buf: String::new(),
        }
    }

    /// Bytes consumed so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes
    }

    /// Lines consumed so far.
    pub fn lines_read(&self) -> u64 {
        self.line_no
    }

    /// Clears `out` and reads up to `max` rows into it; returns how many (0 at the end).
    pub fn next_batch(&mut self, max: usize, out: &mut CriteoBatch) -> Result<usize> {
        out.clear();
        while out.len() < max {
            self.buf.clear();
            // A line is read up to its bounded length, never past it: /dev/zero or a binary file
            // fails at the first long line instead of filling memory.
            let n = (&mut self.inner)
                .take(LINE_LIMIT + 1)
                .read_line(&mut self.buf)
                .map_err(|source| ModelError::CriteoIo {
                    source_name: self.source.clone(),
                    line: self.line_no + 1,
                    source,
                })?;
            if n == 0 {
                break;
            }
            if n as u64 > LINE_LIMIT {
                return Err(ModelError::Criteo {
                    source_name: self.source.clone(),
                    line: self.line_no + 1,
                    column: 0,
                    reason: format!(
                        "the line is longer than {} bytes: not Criteo TSV (a row is ~200 bytes)",
                        LINE_LIMIT
                    ),
                });
            }
            self.bytes += n as u64;
            self.line_no += 1;
            let line = self.buf.strip_suffix('\n').unwrap_or(&self.buf);
            parse_line(line, &self.source, self.line_no, out)?;
        }
        Ok(out.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<CriteoBatch> {
        let mut b = CriteoBatch::default();
        parse_line(line, "t.tsv", 7, &mut b)?;
        Ok(b)
    }

    fn full_line() -> String {
        let mut f = vec!["1".to_string()];
        f.extend((0..DENSE).map(|k| (k as i64 * 3 - 2).to_string()));
        f.extend(
            (0..SPARSE).map(|k| format!("{:08x}", 0x1234_5678u64 * (k as u64 + 1) % (1 << 32))),
        );
        f.join("\t")
    }

    #[test]
    fn reads_a_full_row() {
        let b = parse(&full_line()).unwrap();
        assert_eq!(b.labels, [1.0]);
        // I1 = -2 is clipped to 0; I2 = 1 -> ln 2.
        assert_eq!(b.dense[0], 0.0);
        assert!((b.dense[1] - 2f32.ln()).abs() < 1e-7);
        assert!((b.dense[12] - 35f32.ln()).abs() < 1e-6);
        assert_eq!(b.cats[0], 0x1234_5678);
        assert_eq!(b.cats[25], 0x1234_5678u64 * 26 % (1 << 32));
    }

    #[test]
    fn empty_and_missing_trailing_fields_read_as_zero() {
        let b = parse("0\t\t5\t\t\t\t\t\t\t\t\t\t\t\t\tff").unwrap();
        assert_eq!(b.labels, [0.0]);
        assert_eq!(b.dense[0], 0.0);
        assert!((b.dense[1] - 6f32.ln()).abs() < 1e-6);
        assert_eq!(b.cats[0], 0);
        assert_eq!(b.cats[1], 255);
        assert!(b.cats[2..].iter().all(|&c| c == 0));
        let b = parse("1\r").unwrap();
        assert_eq!(
            (b.labels[0], b.dense.len(), b.cats.len()),
            (1.0, DENSE, SPARSE)
        );
    }

    #[test]
    fn errors_name_line_and_column() {
        let e = parse("2\t1").unwrap_err().to_string();
        assert!(e.contains("line 7, column 1") && e.contains("'2'"), "{e}");
        let e = parse("").unwrap_err().to_string();
        assert!(e.contains("label is empty"), "{e}");
        let e = parse("1\t3\tx7").unwrap_err().to_string();
        assert!(
            e.contains("column 3") && e.contains("I2") && e.contains("'x7'"),
            "{e}"
        );
        let line = full_line();
        let bad = line.rsplit_once('\t').unwrap().0.to_string() + "\tzz";
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("column 40") && e.contains("C26"), "{e}");
        let e = parse(&(full_line() + "\textra")).unwrap_err().to_string();
        assert!(e.contains("more than 40 fields (41 found)"), "{e}");
        let e = parse(&format!("1{}\t{}", "\t".repeat(13), "1".repeat(17))).unwrap_err();
        assert!(e.to_string().contains("at most 16 digits"), "{e}");
    }

    #[test]
    fn failed_line_leaves_the_batch_unchanged() {
        let mut b = CriteoBatch::default();
        parse_line(&full_line(), "t", 1, &mut b).unwrap();
        let before = b.clone();
        assert!(parse_line("1\t2\t3\tnope", "t", 2, &mut b).is_err());
        assert_eq!(b, before);
    }

    #[test]
    fn reader_streams_batches_and_counts_lines() {
        let text = format!("{}\n{}\r\n0\n", full_line(), full_line());
        let mut r = CriteoReader::new(text.as_bytes(), "mem");
        let mut b = CriteoBatch::default();
        assert_eq!(r.next_batch(2, &mut b).unwrap(), 2);
        assert_eq!(r.next_batch(2, &mut b).unwrap(), 1);
        assert_eq!(b.labels, [0.0]);
        assert_eq!(r.next_batch(2, &mut b).unwrap(), 0);
        assert_eq!(r.lines_read(), 3);
        assert_eq!(r.bytes_read(), text.len() as u64);
        let mut r = CriteoReader::new("1\n1\tbad\n".as_bytes(), "f.tsv");
        let e = r.next_batch(10, &mut b).unwrap_err().to_string();
        assert!(e.starts_with("f.tsv, line 2, column 2"), "{e}");
        // An endless line (/dev/zero) stops at the line limit.
        let zeros = std::io::BufReader::new(std::io::repeat(0));
        let mut r = CriteoReader::new(zeros, "/dev/zero");
        let e = r.next_batch(10, &mut b).unwrap_err().to_string();
        assert!(
            e.contains("line 1") && e.contains("longer than 1048576 bytes"),
            "{e}"
        );
    }

    #[test]
    fn sparse_hashes_mod_rows_feature_major() {
        let mut b = CriteoBatch::default();
        parse_line(&full_line(), "t", 1, &mut b).unwrap();
        parse_line("0", "t", 2, &mut b).unwrap();
        let names: Vec<String> = (1..=SPARSE).map(|i| format!("C{i}")).collect();
        let rows: Vec<usize> = (0..SPARSE).map(|i| 10 + i).collect();
        let kj = b.sparse(&names, &rows).unwrap();
        assert_eq!(kj.batch_size(), 2);
        assert_eq!(kj.ids().get(0), (0x1234_5678u64 % 10) as i64);
        assert_eq!(kj.ids().get(1), 0);
        assert_eq!(kj.ids().get(2), ((0x1234_5678u64 * 2) % 11) as i64);
        assert!(b.sparse(&names[..3], &rows[..3]).is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Fuzzing by property (issue 61): any line, arbitrary text or a valid row with bytes
        /// changed, cut or added, parses to one more row or to an error naming the line, and on
        /// an error the batch holds what it held (`parse_line`'s contract).
        #[test]
        fn any_line_parses_or_is_refused_leaving_the_batch_as_it_was(
            junk in "\\PC{0,200}",
            edits in proptest::collection::vec((0usize..400, proptest::prelude::any::<char>()), 0..6),
            cut in 0usize..400,
            mutate in proptest::prelude::any::<bool>(),
        ) {
            let line = if mutate {
                let mut c: Vec<char> = full_line().chars().collect();
                for &(at, ch) in &edits {
                    let at = at % (c.len() + 1);
                    if ch.is_ascii_digit() || at.is_multiple_of(2) {
                        c.insert(at, ch);
                    } else if at < c.len() {
                        c.remove(at);
                    }
                }
                c.truncate(cut.max(1).min(c.len()));
                c.into_iter().collect::<String>()
            } else {
                junk
            };
            let mut b = parse(&full_line()).unwrap();
            let before = b.clone();
            match parse_line(&line, "t.tsv", 7, &mut b) {
                Ok(()) => {
                    proptest::prop_assert_eq!(b.len(), 2);
                    proptest::prop_assert_eq!(b.dense.len(), 2 * DENSE);
                    proptest::prop_assert_eq!(b.cats.len(), 2 * SPARSE);
                }
                Err(e) => {
                    proptest::prop_assert_eq!(&b, &before);
                    let msg = e.to_string();
                    proptest::prop_assert!(msg.contains("t.tsv") && msg.contains('7'), "{}", msg);
                }
            }
        }
    }
}
