//! Reads for row files: a page-aligned buffer, as direct I/O needs, and a read that fills a
//! buffer. The row file reader uses them, and so does the SSD tier's I/O engine (`ember-tier`).

use crate::alloc::{PagePolicy, RowBuf};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Reads until `buf` is full or the file ends; returns the bytes read.
pub fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// A page-aligned buffer, as direct I/O needs.
#[derive(Debug)]
pub struct AlignedBuf(RowBuf);

impl AlignedBuf {
    /// An anonymous mapping: page-aligned.
    pub fn new(len: usize) -> io::Result<Self> {
        RowBuf::new(len, PagePolicy::Small).map(AlignedBuf)
    }
    pub fn bytes(&self) -> &[u8] {
        self.0.as_slice()
    }
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.0.as_mut_slice()
    }
}
