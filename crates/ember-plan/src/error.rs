use thiserror::Error;

/// Errors of the planner.
#[derive(Debug, Error)]
pub enum PlanError {
    /// A table, device or plan file that breaks a rule of its format (the message names the
    /// line).
    #[error("{path}: {reason}")]
    Spec { path: String, reason: String },
    /// A table list (a spec file's, or a plan's) that breaks a rule of its format.
    #[error("{path}: {cause}")]
    Tables {
        path: String,
        #[source]
        cause: SpecError,
    },
    /// A table, device, plan or locality file could not be read or written.
    #[error("{path}: {source}")]
    SpecIo {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A table or plan file is not JSON of its kind.
    #[error("{path}: {source}")]
    SpecJson {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    /// A locality statistics file that does not parse.
    #[error("{path}: {cause}")]
    Locality {
        path: String,
        #[source]
        cause: LocalityError,
    },
    /// A plan breaks a rule (memory, devices, ranges).
    #[error("invalid plan: {0}")]
    Invalid(String),
    /// A plan's shards do not cover the tables once each (the shard check's error).
    #[error("invalid plan: {0}")]
    Cover(#[source] ember_embed::EmbedError),
    /// A plan file whose plan breaks a rule (the rule's error).
    #[error("{path}: {cause}")]
    PlanFile {
        path: String,
        #[source]
        cause: Box<PlanError>,
    },
    /// Running a measurement failed (the embedding stage's error).
    #[error("measurement failed: {0}")]
    Measure(#[source] ember_embed::EmbedError),
    /// A cost model that cannot be used (its coefficients out of range).
    #[error("cost model {path}: {reason}")]
    Profile { path: String, reason: String },
    /// A cost model could not be read or written.
    #[error("cost model {path}: {source}")]
    ProfileIo {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A cost model is not JSON of a cost model.
    #[error("cost model {path}: {source}")]
    ProfileJson {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    /// No placement satisfies the memory caps.
    #[error("does not fit: {0}")]
    NoFit(String),
}

pub type Result<T, E = PlanError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;
    use std::path::Path;

    #[test]
    fn a_missing_table_file_keeps_its_io_error_as_the_source() {
        let path = Path::new("/nonexistent/ember/tables.csv");
        let e = crate::spec::read_tables(path).unwrap_err();
        assert!(matches!(e, PlanError::SpecIo { .. }), "{e:?}");
        let io = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            io.map(|io| io.kind()),
            Some(std::io::ErrorKind::NotFound),
            "{e:?}"
        );
        // The message is the one the text variant printed.
        let os = std::fs::metadata(path).unwrap_err();
        assert_eq!(e.to_string(), format!("{}: {os}", path.display()));
    }

    #[test]
    fn a_profile_that_is_not_json_keeps_serde_json_error_as_the_source() {
        let path = std::env::temp_dir().join(format!("ember-{}-profile.json", std::process::id()));
        std::fs::write(&path, "{ \"coef\": [1, 2,").unwrap();
        let e = crate::cost::CostModel::load(&path).unwrap_err();
        std::fs::remove_file(&path).ok();
        assert!(matches!(e, PlanError::ProfileJson { .. }), "{e:?}");
        let json = e
            .source()
            .and_then(|s| s.downcast_ref::<serde_json::Error>());
        assert!(json.is_some_and(|j| j.is_eof()), "{e:?}");
        let parse =
            serde_json::from_str::<crate::cost::CostModel>("{ \"coef\": [1, 2,").unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("cost model {}: {parse}", path.display())
        );
    }
}

/// Why tables cannot be planned as given: a rule of the table list, or a line of its CSV form.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    #[error("no tables")]
    NoTables,
    #[error("a table has no name")]
    Unnamed,
    #[error("table {table}: rows and dim must be at least 1")]
    Empty { table: String },
    #[error("table {table}: pooling must be a finite number >= 0, not {pooling}")]
    Pooling { table: String, pooling: f64 },
    #[error("table {table} is listed twice")]
    Twice { table: String },
    #[error("no header line")]
    NoHeader,
    #[error("line {line}: no {column} column")]
    NoColumn { line: usize, column: &'static str },
    #[error("line {line}: {found} fields, the header has {want}")]
    Fields {
        line: usize,
        found: usize,
        want: usize,
    },
    #[error("line {line}: {what} '{value}' is not a number")]
    NotNumber {
        line: usize,
        what: &'static str,
        value: String,
    },
    #[error("line {line}: {what} '{value}' is not a whole number")]
    NotWhole {
        line: usize,
        what: &'static str,
        value: String,
    },
    #[error("line {line}: dim {dim} is too large")]
    DimTooLarge { line: usize, dim: u64 },
    #[error("line {line}: {cause}")]
    DType {
        line: usize,
        #[source]
        cause: Box<ember_embed::EmbedError>,
    },
}

/// Why a locality statistics file (Meta's format: datasets, their averages and column-size
/// histograms) does not parse.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LocalityError {
    #[error("line {line}: '{value}' is not a number")]
    NotNumber { line: usize, value: String },
    #[error("line {line}: not a histogram bucket")]
    NotBucket { line: usize },
    #[error("no dataset with a column-size histogram")]
    NoHistogram,
}
