//! Tells the tests which dense kernel families this machine runs: a test of the AMX tiles
//! (`ember_amx`), of AVX2 with FMA (`ember_avx2`), of AVX-512 (`ember_avx512`), of AVX512_BF16 (`ember_avx512_bf16`) or of AVX512_VNNI (`ember_avx512_vnni`)
//! is built as ignored, with the reason in the test summary, where the machine that builds the
//! tests lacks it, rather than passing without running. The tests run where they are built
//! (`cargo test`), as every test of this workspace does.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(ember_amx)");
    println!("cargo::rustc-check-cfg=cfg(ember_avx2)");
    println!("cargo::rustc-check-cfg=cfg(ember_avx512)");
    println!("cargo::rustc-check-cfg=cfg(ember_avx512_bf16)");
    println!("cargo::rustc-check-cfg=cfg(ember_avx512_vnni)");
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            println!("cargo::rustc-cfg=ember_avx2");
        }
        let avx512 = std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl");
        if avx512 {
            println!("cargo::rustc-cfg=ember_avx512");
        }
        if avx512 && std::is_x86_feature_detected!("avx512bf16") {
            println!("cargo::rustc-cfg=ember_avx512_bf16");
        }
        if avx512 && std::is_x86_feature_detected!("avx512vnni") {
            println!("cargo::rustc-cfg=ember_avx512_vnni");
        }
        if avx512 && amx() {
            println!("cargo::rustc-cfg=ember_amx");
        }
    }
}

/// AMX-TILE, -BF16 and -INT8 in CPUID leaf 7 (EDX 24, 22, 25), and Linux grants this process
/// the tile data (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`), as the kernels ask.
#[cfg(target_arch = "x86_64")]
fn amx() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    if __cpuid(0).eax < 7 {
        return false;
    }
    let bits = (1 << 22) | (1 << 24) | (1 << 25);
    if __cpuid_count(7, 0).edx & bits != bits {
        return false;
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: the request changes only this build script's permitted XSAVE features.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                0x1023 as libc::c_long,
                18 as libc::c_long,
            )
        };
        rc == 0
    }
    #[cfg(not(target_os = "linux"))]
    false
}
