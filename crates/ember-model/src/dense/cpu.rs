//! Which dense kernels this CPU runs: AMX tiles, AVX-512 (BF16 / VNNI), or an emulation that
//! gives the same numbers on any CPU. Detected once per process, overridable with
//! `EMBER_DENSE_ISA` (`amx`, `avx512`, `emulated`) for tests and comparisons.
//!
//! AMX tile data is an XSAVE feature the Linux kernel enables per process on request
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, Linux 5.16+): a tile instruction
//! before it faults. [`amx_permitted`] asks once; a refusal (an older kernel, a seccomp filter)
//! leaves the AVX-512 kernels in place and is reported by [`amx_refusal`] for the start-up line.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use super::DenseDType;
use crate::error::{IsaError, ModelError, Result};

/// The kernel family that runs the reduced-precision dense layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DenseIsa {
    /// Portable: bf16 as f32 arithmetic on bf16-rounded values, int8 as integer loops. Exact
    /// about what it computes, slow.
    Emulated,
    /// AVX-512: `vdpbf16ps` (AVX512_BF16) for bf16, `vpdpbusd` (AVX512_VNNI) for int8.
    Avx512,
    /// AMX tiles: `tdpbf16ps` (AMX-BF16), `tdpbssd` (AMX-INT8).
    Amx,
}

impl DenseIsa {
    /// Every family, slowest first.
    pub const ALL: [DenseIsa; 3] = [DenseIsa::Emulated, DenseIsa::Avx512, DenseIsa::Amx];

    /// Whether this CPU (and this process's permissions) can run `dtype` with this family.
    /// `f32` runs on the existing f32 kernels whatever the family.
    pub fn available(self, dtype: DenseDType) -> bool {
        match self {
            DenseIsa::Emulated => true,
            #[cfg(target_arch = "x86_64")]
            DenseIsa::Avx512 => {
                avx512_base()
                    && match dtype {
                        DenseDType::F32 => true,
                        // `vdpbf16ps` where it is fast, else f32 FMAs on the widened
                        // values ([`bf16_dot_fast`]): AVX-512F suffices.
                        DenseDType::Bf16 => true,
                        DenseDType::Int8 => std::is_x86_feature_detected!("avx512vnni"),
                    }
            }
            #[cfg(target_arch = "x86_64")]
            DenseIsa::Amx => avx512_base() && amx_cpuid() && amx_permitted(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The families this machine can run `dtype` with.
    pub fn available_all(dtype: DenseDType) -> Vec<DenseIsa> {
        DenseIsa::ALL
            .into_iter()
            .filter(|i| i.available(dtype))
            .collect()
    }

    /// The best family this machine has for `dtype`.
    pub fn best(dtype: DenseDType) -> DenseIsa {
        *DenseIsa::ALL
            .iter()
            .rev()
            .find(|i| i.available(dtype))
            .expect("emulated is always available")
    }

    /// The family to run `dtype` with: `EMBER_DENSE_ISA` if set (an error if it names an
    /// unknown family or one this machine lacks), else the best. Read once per process.
    pub fn selected(dtype: DenseDType) -> Result<DenseIsa> {
        type Chosen = std::result::Result<DenseIsa, IsaError>;
        static CHOSEN: OnceLock<[Chosen; 3]> = OnceLock::new();
        let all = CHOSEN.get_or_init(|| {
            let var = std::env::var("EMBER_DENSE_ISA")
                .ok()
                .filter(|v| !v.is_empty());
            DenseDType::ALL.map(|d| match &var {
                Some(v) => v.parse::<DenseIsa>().and_then(|i| i.require(d)),
                None => Ok(DenseIsa::best(d)),
            })
        });
        all[dtype as usize].clone().map_err(ModelError::DenseIsa)
    }

    /// `Ok(self)` if this machine can run `dtype` with it, else an error naming both.
    pub fn require(self, dtype: DenseDType) -> std::result::Result<DenseIsa, IsaError> {
        if self.available(dtype) {
            return Ok(self);
        }
        Err(IsaError::Lacking {
            dtype: dtype.name(),
            isa: self.name(),
            refusal: match self {
                DenseIsa::Amx => amx_refusal().map(str::to_string),
                _ => None,
            },
        })
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            DenseIsa::Emulated => "emulated",
            DenseIsa::Avx512 => "avx512",
            DenseIsa::Amx => "amx",
        }
    }

    /// The instructions the family runs `dtype` with, for start-up lines and reports.
    pub fn describe(self, dtype: DenseDType) -> &'static str {
        match (dtype, self) {
            (DenseDType::F32, _) => "f32 fma",
            (DenseDType::Bf16, DenseIsa::Amx) => "amx-bf16 tiles",
            (DenseDType::Bf16, DenseIsa::Avx512) if bf16_dot_fast() => "avx512-bf16 vdpbf16ps",
            (DenseDType::Bf16, DenseIsa::Avx512) => "avx512 fma on bf16",
            (DenseDType::Bf16, DenseIsa::Emulated) => "bf16 emulated in f32",
            (DenseDType::Int8, DenseIsa::Amx) => "amx-int8 tiles",
            (DenseDType::Int8, DenseIsa::Avx512) => "avx512-vnni",
            (DenseDType::Int8, DenseIsa::Emulated) => "int8 emulated",
        }
    }
}

impl fmt::Display for DenseIsa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DenseIsa {
    type Err = IsaError;
    fn from_str(s: &str) -> std::result::Result<Self, IsaError> {
        match s.to_ascii_lowercase().as_str() {
            "emulated" | "scalar" => Ok(DenseIsa::Emulated),
            "avx512" | "avx-512" => Ok(DenseIsa::Avx512),
            "amx" => Ok(DenseIsa::Amx),
            _ => Err(IsaError::Unknown(s.to_string())),
        }
    }
}

/// AVX-512 F/BW/VL, and the embedding stage's choice allows it (`EMBER_ISA=avx2` keeps the
/// dense layers off AVX-512 too: one instruction-set ceiling per process).
#[cfg(target_arch = "x86_64")]
fn avx512_base() -> bool {
    ember_embed::Isa::selected().is_ok_and(|i| i == ember_embed::Isa::Avx512)
}

/// Whether `vdpbf16ps` beats f32 FMAs on widened bf16 here: it must exist (AVX512_BF16), and
/// not be Intel's. Measured on a Sapphire/Emerald Rapids core: one `vdpbf16ps` per 2.15 cycles
/// (~30 flops a cycle) against two FMAs a cycle, so the FMA kernel ran 1.4x faster (120-128
/// against 87 GFLOP/s on DLRM-v2's 512x3456 layers); AMD's Zen 4 issues a zmm `vdpbf16ps` as
/// often as a zmm FMA, for twice the work.
#[cfg(target_arch = "x86_64")]
pub fn bf16_dot_fast() -> bool {
    let v = std::arch::x86_64::__cpuid(0);
    let amd = [v.ebx, v.edx, v.ecx] == [0x6874_7541, 0x6974_6e65, 0x444d_4163]; // "AuthenticAMD"
    amd && std::is_x86_feature_detected!("avx512bf16")
}

#[cfg(not(target_arch = "x86_64"))]
pub fn bf16_dot_fast() -> bool {
    false
}

/// CPUID leaf 7: AMX-TILE (EDX 24), AMX-BF16 (EDX 22), AMX-INT8 (EDX 25); and the OS enables
/// the tile state in XCR0 (bits 17 and 18).
#[cfg(target_arch = "x86_64")]
fn amx_cpuid() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // CPUID leaf 7 is read only if the maximum leaf (leaf 0's EAX) reaches it.
    if __cpuid(0).eax < 7 {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    let bits = (1 << 22) | (1 << 24) | (1 << 25);
    if edx & bits != bits || !std::is_x86_feature_detected!("xsave") {
        return false;
    }
    // OSXSAVE (CPUID 1 ECX 27) is checked before XGETBV, which faults without it.
    if __cpuid(1).ecx & (1 << 27) == 0 {
        return false;
    }
    // SAFETY: XSAVE and OSXSAVE are present (checked above).
    let xcr0 = unsafe { std::arch::x86_64::_xgetbv(0) };
    xcr0 & (0b11 << 17) == 0b11 << 17
}

/// Why AMX was refused, when the CPU has it but the kernel would not enable it.
static REFUSED: OnceLock<Option<String>> = OnceLock::new();

/// Asks Linux, once per process, to enable AMX tile data for this process; `true` when granted
/// (or already granted). Every thread of the process may then run tile instructions.
#[cfg(target_arch = "x86_64")]
pub fn amx_permitted() -> bool {
    REFUSED.get_or_init(request_amx).is_none()
}

#[cfg(not(target_arch = "x86_64"))]
pub fn amx_permitted() -> bool {
    false
}

/// Why AMX tiles could not be enabled on a CPU that has them (`None` when they were, or when
/// the CPU has none).
pub fn amx_refusal() -> Option<&'static str> {
    REFUSED.get().and_then(|r| r.as_deref())
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_amx() -> Option<String> {
    if !amx_cpuid() {
        return Some("the CPU has no AMX tiles (or the OS does not enable them)".into());
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM takes a feature number and changes only this
    // process's permitted XSAVE features; it reads and writes no memory of ours.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    if rc == 0 {
        None
    } else {
        Some(format!(
            "Linux refused AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM: {}); the dense layers \
             run on AVX-512",
            std::io::Error::last_os_error()
        ))
    }
}

#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn request_amx() -> Option<String> {
    Some("AMX tiles are enabled on Linux only".into())
}
