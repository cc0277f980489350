//! Ember's CUDA backend.
//!
//! - [`Gpu`]: a device, its compute and copy streams, and the NVRTC compiler (kernels are built
//!   at run time for the device's own architecture and cached per configuration).
//! - [`GpuEmbeddings`]: an [`ember_embed::EmbeddingCollection`] uploaded to the device, and the
//!   table-batched pooled lookup in every [`Variant`]: the baseline kernel, occupancy-tuned
//!   ([`tune`]), register prefetch, L2 pinning of the hot rows ([`HotPlan`]), their combination,
//!   and deduplication on the GPU.
//! - [`GpuModel`]: a whole [`ember_model::Model`] on the device (MLPs through cuBLAS, the
//!   interaction as a kernel, host-device copies on their own stream overlapped with compute).
//!
//! CUDA is loaded dynamically: this crate builds, and its tests run, on machines without a GPU.
//! [`Gpu::open`] then fails with an error that says what is missing, and the GPU tests are
//! built as ignored, saying why (`build.rs`).

mod device;
mod embed;
mod error;
mod hot;
mod hstu;
pub mod kernels;
mod model;
mod nvrtc;
mod staging;
pub mod tune;

pub use device::{Gpu, GpuInfo, cuda_available};
pub use embed::{EmbedRun, GpuEmbeddings, KernelStats, Variant};
pub use error::{CudaError, Result};
pub use hot::HotPlan;
pub use hstu::{AttentionKernel, GpuHstu, GpuHstuPredictor};
pub use model::{GpuModel, GpuPredictor, PinnedBatch, SLOTS};
pub use nvrtc::{compile_cubin, nvrtc_available, nvrtc_version};
pub use tune::{TuneCache, TuneChoice};
