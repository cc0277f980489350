//! Instruction-set selection: detected once, cached, overridable with `EMBER_ISA`.

use crate::error::{EmbedError, Result};
use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

/// The kernel family a pooled lookup runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable scalar loops (any CPU).
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL + FMA + F16C.
    Avx512,
}

impl Isa {
    /// Every variant, slowest first.
    pub const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2, Isa::Avx512];

    /// Whether this CPU can run the variant.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The variants this CPU can run.
    pub fn available_all() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.available()).collect()
    }

    /// The best variant this CPU has.
    pub fn best() -> Isa {
        *Isa::ALL
            .iter()
            .rev()
            .find(|i| i.available())
            .expect("scalar is always available")
    }

    /// The variant to use by default: `EMBER_ISA` if set (an error if it names an unknown or
    /// unavailable variant), else the best one. Read once per process.
    pub fn selected() -> Result<Isa> {
        static SELECTED: OnceLock<Result<Isa>> = OnceLock::new();
        SELECTED
            .get_or_init(|| match std::env::var("EMBER_ISA") {
                Ok(v) if !v.is_empty() => v.parse::<Isa>().and_then(Isa::require),
                _ => Ok(Isa::best()),
            })
            .clone()
    }

    /// `Ok(self)` if available, else an error naming it.
    pub fn require(self) -> Result<Isa> {
        if self.available() {
            Ok(self)
        } else {
            Err(EmbedError::IsaUnavailable { isa: self.name() })
        }
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Isa {
    type Err = EmbedError;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "scalar" => Ok(Isa::Scalar),
            "avx2" => Ok(Isa::Avx2),
            "avx512" | "avx-512" => Ok(Isa::Avx512),
            _ => Err(EmbedError::BadOption {
                option: "isa",
                reason: format!("'{s}' is not one of scalar, avx2, avx512"),
            }),
        }
    }
}
