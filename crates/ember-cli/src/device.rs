//! `--device cpu|cuda`: where a command runs.

use clap::ValueEnum;

/// Where the forward pass or the embedding stage runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Device {
    /// This machine's CPU cores.
    #[default]
    Cpu,
    /// An NVIDIA GPU through CUDA (binary built with `--features cuda`).
    Cuda,
}

/// Opens GPU `ordinal`, or says why it cannot.
#[cfg(feature = "cuda")]
pub fn open_gpu(ordinal: usize) -> anyhow::Result<std::sync::Arc<ember_cuda::Gpu>> {
    let gpu = ember_cuda::Gpu::open(ordinal)?;
    let i = gpu.info();
    eprintln!(
        "GPU {}: {} (sm_{}{}, {} SMs, {} MiB L2, {} MiB persisting L2 at most, {} GiB)",
        i.ordinal,
        i.name,
        i.compute_capability.0,
        i.compute_capability.1,
        i.sms,
        i.l2_bytes >> 20,
        i.max_persisting_l2_bytes >> 20,
        i.memory_bytes >> 30
    );
    Ok(gpu)
}

/// The error of `--device cuda` in a build without CUDA support.
#[cfg(not(feature = "cuda"))]
pub fn no_cuda() -> anyhow::Error {
    anyhow::anyhow!(
        "this ember was built without CUDA support; rebuild with \
         `cargo build --release -p ember-cli --features cuda` (CUDA itself is loaded at run time)"
    )
}
