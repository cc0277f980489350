use thiserror::Error;

/// Errors of the planner.
#[derive(Debug, Error)]
pub enum PlanError {
    /// A table or device file could not be read or parsed (the message names the line).
    #[error("{path}: {reason}")]
    Spec { path: String, reason: String },
    /// A plan breaks a rule (coverage, memory, ranges).
    #[error("invalid plan: {0}")]
    Invalid(String),
    /// Running a measurement failed.
    #[error("measurement failed: {0}")]
    Measure(String),
    /// A cost profile that cannot be used.
    #[error("cost profile {path}: {reason}")]
    Profile { path: String, reason: String },
    /// No placement satisfies the memory caps.
    #[error("does not fit: {0}")]
    NoFit(String),
}

pub type Result<T, E = PlanError> = std::result::Result<T, E>;
