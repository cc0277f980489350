//! Small helpers every command may use (serve, predict, store, plan, data and the benchmarks):
//! byte counts for people, the memory the OS says is available.

/// Bytes as a short human string (GiB / MiB).
pub fn human_bytes(b: usize) -> String {
    let b = b as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    }
}

/// Bytes of memory the OS says are available (`/proc/meminfo`'s `MemAvailable`), if it tells
/// (None off Linux).
pub fn mem_available() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_as_gib_or_mib() {
        assert_eq!(human_bytes(3 << 30), "3.00 GiB");
        assert_eq!(human_bytes(5 << 20), "5.0 MiB");
        assert_eq!(human_bytes(0), "0.0 MiB");
    }

    #[test]
    fn available_memory_is_read_where_linux_tells_it() {
        if cfg!(target_os = "linux") {
            let avail = mem_available().expect("/proc/meminfo has MemAvailable on Linux");
            assert!(avail > 0);
        }
    }
}
