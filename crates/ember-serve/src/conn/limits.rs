//! The process's descriptor limit: raised at start-up from its soft value to its hard one, so
//! that the connection cap, not the OS, decides when connections are refused.

/// Descriptors kept free for everything but client connections: listeners, row files, the
/// allocator, the runtime.
pub(crate) const RESERVED_FDS: usize = 256;

/// Connections the kernel may hold complete but not yet accepted (capped by
/// `net.core.somaxconn`). Tokio's default of 1024 overflowed when a burst of clients connected
/// while the workers were busy: each dropped SYN is retried by the client only after a second.
pub(crate) const LISTEN_BACKLOG: u32 = 4096;

/// A listening socket on `addr` with [`LISTEN_BACKLOG`] (and `SO_REUSEADDR`, as tokio's
/// `bind` sets).
pub(crate) fn listen(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = match addr {
        std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the soft limit in effect after.
pub(crate) fn raise_fd_limit() -> Option<usize> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given, a valid local.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur < lim.rlim_max {
        let want = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct it is given, a valid local.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        }
    }
    usize::try_from(lim.rlim_cur).ok()
}

/// The most connections to hold open: the configured cap, within the descriptors left after
/// [`RESERVED_FDS`].
pub(crate) fn connection_cap(configured: usize, fd_limit: Option<usize>) -> usize {
    match fd_limit {
        Some(l) => configured.min(l.saturating_sub(RESERVED_FDS).max(1)),
        None => configured,
    }
    .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_room_for_the_process() {
        assert_eq!(connection_cap(16_384, Some(1_024)), 768);
        assert_eq!(connection_cap(100, Some(1_048_576)), 100);
        assert_eq!(connection_cap(100, None), 100);
        assert_eq!(connection_cap(100, Some(10)), 1);
        let after = raise_fd_limit().expect("getrlimit works here");
        assert!(after >= 64, "soft limit {after}");
    }
}
