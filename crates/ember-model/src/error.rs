//! The one error type of `ember-model`.

use std::path::PathBuf;

use ember_embed::EmbedError;
use thiserror::Error;

/// Everything that can go wrong loading a model, reading data or running a forward pass.
#[derive(Debug, Error)]
pub enum ModelError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `config.json` is malformed or inconsistent.
    #[error("{path}: {reason}")]
    Config { path: PathBuf, reason: String },
    /// A weight tensor is missing, extra, or has the wrong dtype or shape.
    #[error("weights {path}: tensor '{tensor}': {reason}")]
    Weights {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    /// The weights file is not a valid safetensors file.
    #[error("weights {path}: not a valid safetensors file: {reason}")]
    Safetensors { path: PathBuf, reason: String },
    /// A batch does not fit the model.
    #[error("bad input: {0}")]
    Input(String),
    /// A line of Criteo TSV data does not parse.
    #[error("{source_name}, line {line}, column {column}: {reason}")]
    Criteo {
        source_name: String,
        line: u64,
        column: usize,
        reason: String,
    },
    /// An option is out of range.
    #[error("bad option {option}: {reason}")]
    BadOption {
        option: &'static str,
        reason: String,
    },
    /// From the embedding stage.
    #[error(transparent)]
    Embed(#[from] EmbedError),
    /// A device (a GPU) failed running a batch.
    #[error("{device}: {reason}")]
    Device { device: String, reason: String },
}

/// Who is at fault when a batch fails, so that a server can answer with the right status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The caller's input does not fit the model (a 400 / INVALID_ARGUMENT).
    Input,
    /// The engine or its storage failed (a 500 / INTERNAL): a damaged row file, a device error.
    Internal,
    /// A store the model reads from did not answer in time (a 503 / UNAVAILABLE naming it): the
    /// request may succeed when retried.
    Unavailable,
}

impl ModelError {
    /// Whether the caller or the engine is at fault.
    pub fn kind(&self) -> ErrorKind {
        use EmbedError as E;
        match self {
            ModelError::Input(_) | ModelError::Criteo { .. } => ErrorKind::Input,
            ModelError::Embed(
                E::LengthsCount { .. }
                | E::LengthsSum { .. }
                | E::OffsetsCount { .. }
                | E::OffsetsStart { .. }
                | E::OffsetsDecreasing { .. }
                | E::OffsetsEnd { .. }
                | E::WeightsLen { .. }
                | E::NegativeId { .. }
                | E::IdOutOfRange { .. }
                | E::KeysMismatch { .. }
                | E::DuplicateKey { .. }
                | E::MissingWeights
                | E::UnexpectedWeights { .. },
            ) => ErrorKind::Input,
            ModelError::Embed(E::StoreUnavailable { .. }) => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        }
    }

    /// The message for the caller: an input error without the "bad input: " prefix, as a client
    /// should read it; any other error as displayed.
    pub fn message(&self) -> String {
        match self {
            ModelError::Input(m) => m.clone(),
            e => e.to_string(),
        }
    }
}

/// `Result` with [`ModelError`].
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
