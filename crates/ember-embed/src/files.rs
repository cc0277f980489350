//! Opening the files a user names (model configs, weights, row files, data, traces, plans):
//! only regular files, and, for those read whole into memory, only up to a stated size. A FIFO,
//! a device (`/dev/zero`), a directory or a socket is refused at once with an error naming what
//! it is, rather than read until memory runs out or blocked on forever.
//!
//! | what | limit |
//! |---|---|
//! | model config (`config.json`), plans, table specs, access profiles | [`TEXT_LIMIT`] |
//! | id traces | [`TRACE_LIMIT`] |
//! | weights, row files | regular files only (mapped or read by row, never whole) |
//! | Criteo data | regular files or stdin; lines of at most [`LINE_LIMIT`] |

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Largest config, plan, table spec or profile read whole: 256 MiB (a config of 10^6 features
/// is ~36 MB).
pub const TEXT_LIMIT: u64 = 256 << 20;

/// Largest id trace read whole: 1 GiB (~100M ids).
pub const TRACE_LIMIT: u64 = 1 << 30;

/// Longest line of a data file: 1 MiB (a Criteo row is ~200 bytes).
pub const LINE_LIMIT: u64 = 1 << 20;

/// Opens `path` for reading if it is a regular file (symlinks followed); `what` names it in the
/// error ("model config", "trace", ...).
pub fn open_regular(path: &Path, what: &str) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let not_regular = |meta: &std::fs::Metadata| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("the {what} is {}, not a regular file", kind(meta)),
        )
    };
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    // Non-blocking, so that a file swapped for a FIFO since the check cannot block the open
    // (it has no effect on reading a regular file).
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    Ok(file)
}

/// Refuses `path` unless it is a regular file (symlinks followed), without opening it.
pub fn check_regular(path: &Path, what: &str) -> io::Result<()> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("the {what} is {}, not a regular file", kind(&meta)),
        ));
    }
    Ok(())
}

/// Reads the regular file at `path` whole, refusing one of more than `limit` bytes (checked
/// from its size, and again while reading, should it grow).
pub fn read_limited(path: &Path, what: &str, limit: u64) -> io::Result<Vec<u8>> {
    let file = open_regular(path, what)?;
    let size = file.metadata()?.len();
    let too_large = |size: u64| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "the {what} is {}, over the limit of {} for one",
                human(size),
                human(limit)
            ),
        )
    };
    if size > limit {
        return Err(too_large(size));
    }
    let mut out = Vec::with_capacity(size as usize);
    file.take(limit + 1).read_to_end(&mut out)?;
    if out.len() as u64 > limit {
        return Err(too_large(out.len() as u64));
    }
    Ok(out)
}

/// [`read_limited`] as UTF-8 text.
pub fn read_text(path: &Path, what: &str, limit: u64) -> io::Result<String> {
    String::from_utf8(read_limited(path, what, limit)?).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the {what} is not UTF-8 text: {}", e.utf8_error()),
        )
    })
}

fn kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Bytes in the largest binary unit that keeps a number above 1.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    match u {
        0 => format!("{bytes} bytes"),
        _ => format!("{v:.1} {}", UNITS[u]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_of_a_bounded_size_are_read() {
        let dir = std::env::temp_dir().join(format!("ember-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("a.json");
        std::fs::write(&f, "{\"x\": 1}").unwrap();
        assert_eq!(read_text(&f, "model config", 100).unwrap(), "{\"x\": 1}");
        let e = read_text(&f, "model config", 4).unwrap_err().to_string();
        assert!(
            e.contains("the model config is 8 bytes, over the limit of 4 bytes"),
            "{e}"
        );
        let e = read_text(&dir, "model config", 100)
            .unwrap_err()
            .to_string();
        assert!(e.contains("is a directory, not a regular file"), "{e}");
        let e = read_text(Path::new("/dev/zero"), "trace", 100)
            .unwrap_err()
            .to_string();
        assert!(e.contains("the trace is a character device"), "{e}");
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Refused at once: no writer ever opens it, so opening it for reading would block.
        let e = read_text(&fifo, "model config", 100)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("is a FIFO (named pipe), not a regular file"),
            "{e}"
        );
        std::fs::write(&f, [0xff, 0xfe]).unwrap();
        let e = read_text(&f, "plan", 100).unwrap_err().to_string();
        assert!(e.contains("the plan is not UTF-8"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(human(3 << 20), "3.0 MiB");
        assert_eq!(human(1000), "1000 bytes");
    }
}
