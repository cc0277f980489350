//! The disk's side of the SSD-tier benchmark: its own random-read rate through the tier's I/O
//! engine (the ceiling of any lookup that misses the cache), and dropping files from the page
//! cache for a cold start without root.

use ember_tier::storage::io::{IoEngine, Read};
use std::fs::File;
use std::io;
use std::path::Path;

/// The disk's own random-read rate: `depth` random single-block reads in flight over `files`
/// (each read at a random block of a random file's first `lens[i]` bytes) for about `secs`
/// seconds. Returns (reads per second, bytes per second).
pub fn random_read_rate(
    engine: &mut IoEngine,
    files: &[&File],
    lens: &[u64],
    block: usize,
    secs: f64,
    seed: u64,
) -> io::Result<(f64, f64)> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let depth = engine.depth();
    let (mut n, start) = (0u64, std::time::Instant::now());
    let mut reads = Vec::with_capacity(depth * 4);
    while start.elapsed().as_secs_f64() < secs {
        reads.clear();
        for _ in 0..depth * 4 {
            let f = rng.random_range(0..files.len());
            let blocks = (lens[f] / block as u64).max(1);
            reads.push(Read {
                file: f,
                offset: rng.random_range(0..blocks) * block as u64,
                len: block,
            });
        }
        engine.read(files, &reads).map_err(|e| e.error)?;
        n += reads.len() as u64;
    }
    let s = start.elapsed().as_secs_f64();
    Ok((n as f64 / s, (n * block as u64) as f64 / s))
}

/// Drops `path`'s clean pages from the OS page cache (`posix_fadvise(DONTNEED)`), so that the next
/// buffered or mapped read of it goes to the disk, and returns (pages still resident, pages), as
/// `mincore` reports them. Benchmarks use it for a cold start without root.
pub fn evict_page_cache(path: &Path) -> io::Result<(u64, u64)> {
    use std::os::fd::AsRawFd;
    let f = File::open(path)?;
    let len = f.metadata()?.len() as usize;
    // SAFETY: an FFI call on a descriptor that is open for the whole call; no memory is passed.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    if len == 0 {
        return Ok((0, 0));
    }
    // SAFETY: a read-only shared mapping that is never read, only passed to mincore, and dropped
    // before returning.
    let map = unsafe { memmap2::Mmap::map(&f) }?;
    let page = 4096;
    let pages = len.div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: `map` is a live mapping of `len` bytes at a page-aligned address, and `vec` has one
    // byte per page of it, as mincore(2) requires.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let resident = vec.iter().filter(|&&b| b & 1 == 1).count() as u64;
    Ok((resident, pages as u64))
}
