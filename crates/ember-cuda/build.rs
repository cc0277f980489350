//! Tells the tests what this machine has, so that a test that cannot run here is built as
//! ignored, with the reason in the test summary, rather than passing without running:
//! `ember_cuda_device` when an NVIDIA device node exists, `ember_nvrtc` when `libnvrtc.so` is in
//! a directory of `LD_LIBRARY_PATH` or a usual CUDA library directory. Test binaries built
//! elsewhere and run on a GPU machine (`bench/gpu/device_check.sh`) pass `--include-ignored`.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo::rustc-check-cfg=cfg(ember_cuda_device)");
    println!("cargo::rustc-check-cfg=cfg(ember_nvrtc)");
    println!("cargo::rerun-if-env-changed=LD_LIBRARY_PATH");
    if Path::new("/dev/nvidia0").exists() {
        println!("cargo::rustc-cfg=ember_cuda_device");
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(
        [
            "/usr/local/cuda/lib64",
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64",
        ]
        .iter()
        .map(PathBuf::from),
    );
    let has_nvrtc = |d: &PathBuf| {
        std::fs::read_dir(d).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.starts_with("libnvrtc.so"))
            })
        })
    };
    if dirs.iter().any(has_nvrtc) {
        println!("cargo::rustc-cfg=ember_nvrtc");
    }
}
