//! Every kernel source compiles with NVRTC to a cubin for the GPUs Ember targets (A100 sm_80,
//! H100 sm_90), for every dtype, load shape, pooling, id width and launch the tuner can pick.
//! Needs only libnvrtc, no GPU: it runs wherever NVRTC is found (e.g. with a PyTorch wheel's
//! `nvidia/cu13/lib` on LD_LIBRARY_PATH), and is built as ignored, saying so, elsewhere.

use ember_cuda::kernels::{DEDUP_SRC, Launch, MODEL_SRC, PoolConfig, Shape};
use ember_cuda::{compile_cubin, nvrtc_available, nvrtc_version, tune};
use ember_embed::{DType, Pooling};

/// Fails, saying what is missing, where NVRTC does not load.
fn require_nvrtc() {
    if !nvrtc_available() {
        if cfg!(ember_nvrtc) {
            panic!(
                "libnvrtc.so was found when this test was built (build.rs) but does not load now"
            );
        }
        panic!(
            "libnvrtc.so not found (set LD_LIBRARY_PATH to a CUDA 13 lib directory): this test \
             is built as ignored where it is absent; --include-ignored runs it anyway"
        );
    }
    eprintln!("NVRTC {:?}", nvrtc_version().unwrap());
}

#[test]
#[cfg_attr(
    not(ember_nvrtc),
    ignore = "needs libnvrtc.so (none on LD_LIBRARY_PATH when built)"
)]
fn pool_kernel_compiles_for_every_dtype_shape_and_pooling() {
    require_nvrtc();
    let mut n = 0;
    for dtype in DType::ALL {
        // Dims that give every load width and the scalar path, one to several chunks per lane.
        for dim in [1, 13, 16, 64, 128, 200, 512] {
            for pooling in [Pooling::Sum, Pooling::Mean, Pooling::WeightedSum] {
                for (id64, launch, pin) in [
                    (true, Launch::BASELINE, false),
                    (false, Launch::PREFETCH, true),
                ] {
                    let cfg = PoolConfig {
                        dtype,
                        shape: Shape::for_table(dtype, dim),
                        launch,
                        id64,
                        pooling,
                        pin,
                    };
                    let cubin = compile_cubin(&cfg.source(), &cfg.name(), "sm_90", &cfg.options())
                        .unwrap_or_else(|e| panic!("{}: {e}", cfg.name()));
                    assert!(
                        cubin.starts_with(b"\x7fELF"),
                        "{}: not an ELF cubin",
                        cfg.name()
                    );
                    n += 1;
                }
            }
        }
    }
    eprintln!("{n} pool kernels compiled");
}

#[test]
#[cfg_attr(
    not(ember_nvrtc),
    ignore = "needs libnvrtc.so (none on LD_LIBRARY_PATH when built)"
)]
fn every_launch_the_tuner_tries_compiles() {
    require_nvrtc();
    let shape = Shape::for_table(DType::F32, 128);
    let mut launches = tune::occupancy_grid(1);
    launches.extend(tune::prefetch_grid(Launch::BASELINE));
    for arch in ["sm_80", "sm_90"] {
        for &launch in &launches {
            let cfg = PoolConfig {
                dtype: DType::F32,
                shape,
                launch,
                id64: true,
                pooling: Pooling::Sum,
                pin: true,
            };
            compile_cubin(&cfg.source(), &cfg.name(), arch, &cfg.options())
                .unwrap_or_else(|e| panic!("{arch} {}: {e}", cfg.name()));
        }
    }
}

#[test]
#[cfg_attr(
    not(ember_nvrtc),
    ignore = "needs libnvrtc.so (none on LD_LIBRARY_PATH when built)"
)]
fn dedup_and_model_kernels_compile() {
    require_nvrtc();
    for arch in ["sm_80", "sm_90"] {
        compile_cubin(DEDUP_SRC, "dedup.cu", arch, &[]).unwrap();
        compile_cubin(MODEL_SRC, "model.cu", arch, &[]).unwrap();
    }
}

#[test]
#[cfg_attr(
    not(ember_nvrtc),
    ignore = "needs libnvrtc.so (none on LD_LIBRARY_PATH when built)"
)]
fn hstu_kernels_compile_for_every_width() {
    require_nvrtc();
    // MLPerf DLRMv3 (128), hstu-small (32), the parity fixtures' odd widths (no tensor cores).
    // Tensor-core widths with a q.k step or an output block past ldmatrix.x4's (48, 24; 16, 8)
    // compile both bf16 kernels; widths tensor cores cannot take compile neither.
    for (qk, hid) in [(128, 128), (32, 32), (7, 6), (16, 8), (64, 24), (48, 24)] {
        let (src, name) = ember_cuda::kernels::hstu_source(qk, hid);
        let tensor_cores = qk % 16 == 0 && hid % 8 == 0;
        for arch in ["sm_80", "sm_90"] {
            let cubin = compile_cubin(&src, &name, arch, &[]).unwrap();
            for kernel in ["hstu_attn_bf16", "hstu_attn_bf16_v2"] {
                let has = cubin
                    .windows(kernel.len() + 1)
                    .any(|w| &w[..kernel.len()] == kernel.as_bytes() && w[kernel.len()] == 0);
                assert_eq!(has, tensor_cores, "{kernel} in {name} for {arch}");
            }
        }
    }
}
