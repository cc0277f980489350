use thiserror::Error;

/// Errors of the CUDA backend.
#[derive(Debug, Error)]
pub enum CudaError {
    /// The CUDA driver library (`libcuda.so`) or a device is missing.
    #[error("no CUDA device: {0}")]
    Unavailable(String),
    /// NVRTC (`libnvrtc.so`) is missing.
    #[error(
        "NVRTC (libnvrtc.so.13) not found: install the CUDA 13 toolkit or put its lib directory \
         (e.g. a PyTorch wheel's nvidia/cu13/lib) on LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    /// A kernel failed to compile (the log is NVRTC's).
    #[error("NVRTC could not compile {kernel} ({options}):\n{log}")]
    Compile {
        kernel: String,
        options: String,
        log: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA {what}: {source}")]
    Driver {
        what: &'static str,
        source: cudarc::driver::DriverError,
    },
    /// A cuBLAS call failed.
    #[error("cuBLAS {what}: {source:?}")]
    Blas {
        what: &'static str,
        source: cudarc::cublas::result::CublasError,
    },
    /// A cuBLASLt call failed (the bf16 dense layers).
    #[error("cuBLASLt {what}: {source:?}")]
    BlasLt {
        what: &'static str,
        source: cudarc::cublaslt::result::CublasError,
    },
    /// The input (batch, tables, options) does not fit what was asked.
    #[error("{0}")]
    Input(String),
    /// An error of the embedding layer (validation of a batch).
    #[error(transparent)]
    Embed(#[from] ember_embed::EmbedError),
    /// An error of the model layer.
    #[error(transparent)]
    Model(#[from] ember_model::ModelError),
    /// Reading or writing the autotuner's cache file failed.
    #[error("autotune cache {path}: {source}")]
    TuneCache {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The autotuner's cache file is not JSON of tuned choices (or they could not be encoded).
    #[error("autotune cache {path}: {source}")]
    TuneCacheJson {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;

impl CudaError {
    /// The model-level error of a batch that failed on `device`: the caller's mistakes stay
    /// input errors; the device's own failures say which device.
    pub fn into_model(self, device: String) -> ember_model::ModelError {
        use ember_model::ModelError;
        match self {
            CudaError::Input(m) => ModelError::Input(m),
            CudaError::Embed(e) => ModelError::Embed(e),
            CudaError::Model(e) => e,
            e => ModelError::Device {
                device,
                source: Box::new(e),
            },
        }
    }
}

/// Attaches what was being done to a driver error.
pub(crate) trait DriverCtx<T> {
    fn ctx(self, what: &'static str) -> Result<T>;
}

impl<T> DriverCtx<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn ctx(self, what: &'static str) -> Result<T> {
        self.map_err(|source| CudaError::Driver { what, source })
    }
}
