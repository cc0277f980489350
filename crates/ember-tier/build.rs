//! Tells the tests whether this machine's kernel lets a process set up an io_uring (some
//! sandboxes and kernels refuse it): the io_uring case of the SSD tier's tests is built as
//! ignored, with the reason in the test summary, where it does not (`ember_io_uring`). The tier
//! itself falls back to pread at run time either way.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(ember_io_uring)");
    if io_uring_works() {
        println!("cargo::rustc-cfg=ember_io_uring");
    }
}

/// Whether `io_uring_setup` gives a ring of one entry (closed at once).
fn io_uring_works() -> bool {
    // struct io_uring_params is 120 bytes; zeroed asks for defaults.
    let mut params = [0u8; 120];
    // SAFETY: io_uring_setup reads and writes `params` (120 bytes, as the kernel's struct) and
    // returns a file descriptor or -1; the descriptor is closed below.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    if fd < 0 {
        return false;
    }
    // SAFETY: `fd` is the descriptor the call above returned, closed once.
    unsafe { libc::close(fd as i32) };
    true
}
