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
    /// `config.json` is inconsistent: a rule of the format broken (a table twice, a feature
    /// naming no table, a row file that does not match).
    #[error("{path}: {reason}")]
    Config { path: PathBuf, reason: String },
    /// `config.json` is not JSON of a model config.
    #[error("{path}: {source}")]
    ConfigJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A weight tensor is missing, extra, or has the wrong dtype or shape.
    #[error("weights {path}: tensor '{tensor}': {reason}")]
    Weights {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    /// The weights file is not a valid safetensors file: a rule of the format broken (a header
    /// longer than the file, an entry out of range).
    #[error("weights {path}: not a valid safetensors file: {reason}")]
    Safetensors { path: PathBuf, reason: String },
    /// The weights file is not a valid safetensors file, as the `safetensors` crate reads it.
    #[error("weights {path}: not a valid safetensors file: {source}")]
    SafetensorsFormat {
        path: PathBuf,
        #[source]
        source: safetensors::SafeTensorError,
    },
    /// The header of a safetensors file is not JSON.
    #[error("weights {path}: not a valid safetensors file: its header: {source}")]
    SafetensorsHeader {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
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
    /// Reading Criteo TSV data failed (the file, not the text: kept as the I/O error).
    #[error("{source_name}, line {line}: read failed: {source}")]
    CriteoIo {
        source_name: String,
        line: u64,
        #[source]
        source: std::io::Error,
    },
    /// An option is out of range.
    #[error("bad option {option}: {reason}")]
    BadOption {
        option: &'static str,
        reason: String,
    },
    /// `EMBER_DENSE_ISA` names a family that is unknown or that this machine lacks.
    #[error("bad option EMBER_DENSE_ISA: {0}")]
    DenseIsa(#[source] IsaError),
    /// From the embedding stage.
    #[error(transparent)]
    Embed(#[from] EmbedError),
    /// A device (a GPU) failed running a batch: the backend's error (a driver call, a kernel's
    /// compile), kept whole.
    #[error("{device}: {source}")]
    Device {
        device: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Why a dense kernel family cannot be used as asked (`EMBER_DENSE_ISA`, a benchmark's choice).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IsaError {
    /// A name that is no family.
    #[error("'{0}' is not one of emulated, avx512, amx")]
    Unknown(String),
    /// A family this machine cannot run `dtype` with (for AMX, the kernel's refusal when it
    /// refused the tiles).
    #[error(
        "this CPU cannot run {dtype} dense layers on {isa}{}",
        refusal.as_deref().map(|r| format!(": {r}")).unwrap_or_default()
    )]
    Lacking {
        /// The dense dtype's name (`DenseDType::name`).
        dtype: &'static str,
        /// The family's name (`DenseIsa::name`).
        isa: &'static str,
        refusal: Option<String>,
    },
}

/// A rule of a format broken, said in words: what a check of a model's config found, where
/// nothing but words can say it. [`ModelError::Config`] carries it with the file's path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

impl From<String> for Invalid {
    fn from(s: String) -> Self {
        Invalid(s)
    }
}

impl From<&str> for Invalid {
    fn from(s: &str) -> Self {
        Invalid(s.to_string())
    }
}

/// Who is at fault when a batch fails, so that a server can answer with the right status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The caller's input does not fit the model (a 400 / INVALID_ARGUMENT).
    Input,
    /// The engine or its storage failed (a 500 / INTERNAL): a damaged row file, a device error.
    Internal,
    /// A store the model reads from did not answer in time, or does not hold a row it should
    /// (lost with a node, or a push not finished): a 503 / UNAVAILABLE naming the store or the
    /// row. The request may succeed when retried, or once the version is pushed again.
    Unavailable,
}

impl ModelError {
    /// A store the model reads from did not answer (`kind`: the metrics' label, "connect",
    /// "timeout", ...; `detail`: what it met): [`ErrorKind::Unavailable`], a 503. For loaders
    /// and stores of a caller's own, which have no [`EmbedError`] to give.
    pub fn store_unavailable(
        store: impl Into<String>,
        kind: &'static str,
        detail: impl Into<String>,
    ) -> ModelError {
        ModelError::Embed(EmbedError::StoreUnavailable {
            store: store.into(),
            kind,
            node: String::new(),
            detail: detail.into(),
        })
    }

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
            ModelError::Embed(E::StoreUnavailable { .. } | E::RemoteRow { .. }) => {
                ErrorKind::Unavailable
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    /// A file in the temporary directory holding `bytes`, named for this test run.
    fn temp_file(name: &str, bytes: &[u8]) -> PathBuf {
        let path = std::env::temp_dir().join(format!("ember-{}-{name}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn a_config_that_is_not_json_keeps_serde_json_error_as_the_source() {
        let text = "{ \"tables\": [ not json";
        let path = temp_file("config.json", text.as_bytes());
        let e = crate::ModelConfig::read(&path).unwrap_err();
        std::fs::remove_file(&path).ok();
        assert!(matches!(e, ModelError::ConfigJson { .. }), "{e:?}");
        let json = e
            .source()
            .and_then(|s| s.downcast_ref::<serde_json::Error>());
        assert!(json.is_some_and(|j| j.is_syntax()), "{e:?}");
        // The message is the one the text variant printed.
        let parse = serde_json::from_str::<crate::ModelConfig>(text).unwrap_err();
        assert_eq!(e.to_string(), format!("{}: {parse}", path.display()));
        assert_eq!(e.kind(), ErrorKind::Internal);
    }

    #[test]
    fn weights_that_are_not_safetensors_keep_its_error_as_the_source() {
        let bytes = b"\x02\0\0\0\0\0\0\0{]";
        let path = temp_file("model.safetensors", bytes);
        let cfg = crate::presets::preset("small", ember_embed::DType::F32)
            .unwrap()
            .config;
        let e = crate::weights::read_weights(&path, &cfg, None, crate::weights::Pace::default())
            .err()
            .unwrap();
        std::fs::remove_file(&path).ok();
        assert!(matches!(e, ModelError::SafetensorsFormat { .. }), "{e:?}");
        let source = e.source().unwrap();
        assert!(source.is::<safetensors::SafeTensorError>(), "{source:?}");
        let reason = safetensors::SafeTensors::deserialize(bytes).err().unwrap();
        assert_eq!(
            e.to_string(),
            format!(
                "weights {}: not a valid safetensors file: {reason}",
                path.display()
            )
        );
    }

    #[test]
    fn the_remote_stores_failures_are_unavailable_and_a_damaged_local_file_internal() {
        use ember_embed::EmbedError as E;
        let down = E::StoreUnavailable {
            store: "redis cluster at x".into(),
            kind: "timeout",
            node: "x".into(),
            detail: "no answer".into(),
        };
        let lost = E::RemoteRow {
            model: "m".into(),
            version: 1,
            table: "t".into(),
            row: 7,
            reason: "missing in the store".into(),
        };
        let damaged = E::RowFile {
            path: "t.rows".into(),
            reason: "truncated".into(),
        };
        assert_eq!(ModelError::Embed(down).kind(), ErrorKind::Unavailable);
        let lost = ModelError::Embed(lost);
        assert_eq!(lost.kind(), ErrorKind::Unavailable);
        assert!(
            lost.message().contains("table 't', row 7: missing"),
            "{}",
            lost.message()
        );
        assert_eq!(ModelError::Embed(damaged).kind(), ErrorKind::Internal);
    }
}
