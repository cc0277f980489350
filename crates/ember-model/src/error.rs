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
}

/// `Result` with [`ModelError`].
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
