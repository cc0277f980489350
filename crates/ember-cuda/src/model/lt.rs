//! Dense layers on tensor cores: bf16 GEMMs through cuBLASLt, the bias and ReLU fused into the
//! GEMM's epilogue (no pass of their own over the activations).
//!
//! Each layer is `y = act(x W^T + b)` over row-major `[batch, in]` activations and PyTorch's
//! row-major `[out, in]` weights, run column-major as `y^T = W x^T` with `W` read transposed
//! (cuBLASLt's "TN" layout, the one its tensor-core kernels prefer). Inputs and weights are bf16
//! (their 16 bits); the output is bf16 where another GEMM reads it, f32 where a kernel of the
//! interaction or the logits read it, and the bias has the output's type. Accumulation is f32.
//!
//! A layer's descriptors and the algorithm cuBLASLt's heuristic picks are made once per
//! (shape, batch size, output type, bias) and kept: the heuristic costs tens of microseconds.

use std::collections::HashMap;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream};

use crate::device::{Gpu, dptr};
use crate::error::{CudaError, DriverCtx, Result};

/// A GEMM's output (and bias) type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Out {
    Bf16,
    F32,
}

impl Out {
    fn cuda(self) -> sys::cudaDataType {
        match self {
            Out::Bf16 => sys::cudaDataType::CUDA_R_16BF,
            Out::F32 => sys::cudaDataType::CUDA_R_32F,
        }
    }
}

/// One layer's call: its shape and the device pointers it reads and writes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LtCall {
    pub n_out: usize,
    pub n_in: usize,
    pub batch: usize,
    /// bf16 `[n_out, n_in]`.
    pub w: u64,
    /// `n_out` values of the output's type; 0 for none.
    pub bias: u64,
    /// bf16 `[batch, n_in]`.
    pub x: u64,
    /// `[batch, n_out]` of `out`.
    pub y: u64,
    pub out: Out,
    pub relu: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    n_out: usize,
    n_in: usize,
    batch: usize,
    out: Out,
    relu: bool,
    bias: u64,
}

/// Descriptors and the chosen algorithm of one layer at one batch size.
#[derive(Debug)]
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each handle was created by this plan and is destroyed once, here.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.d);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// A cuBLASLt handle, its workspace, and the plans made so far.
#[derive(Debug)]
pub(crate) struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    plans: HashMap<Key, Plan>,
}

// SAFETY: the handle and descriptors are plain host objects owned by this value; cuBLASLt
// allows their use from any thread, one at a time (`&mut self` for every call).
unsafe impl Send for Lt {}

/// Workspace for cuBLASLt's kernels: 32 MiB, NVIDIA's advice for Hopper.
const WORKSPACE: usize = 32 << 20;

impl Lt {
    pub(crate) fn new(gpu: &Gpu) -> Result<Lt> {
        let handle = lt::create_handle().map_err(|source| CudaError::BlasLt {
            what: "creating a handle (is libcublasLt.so.13 on LD_LIBRARY_PATH?)",
            source,
        })?;
        let workspace = gpu
            .compute()
            .alloc_zeros::<u8>(WORKSPACE)
            .ctx("allocating cuBLASLt's workspace")?;
        Ok(Lt {
            handle,
            workspace,
            plans: HashMap::new(),
        })
    }

    /// Enqueues one layer on `stream`. Nothing for an empty batch.
    pub(crate) fn linear(&mut self, stream: &CudaStream, c: &LtCall) -> Result<()> {
        if c.batch == 0 {
            return Ok(());
        }
        let key = Key {
            n_out: c.n_out,
            n_in: c.n_in,
            batch: c.batch,
            out: c.out,
            relu: c.relu,
            bias: c.bias,
        };
        if !self.plans.contains_key(&key) {
            let plan = self.plan(&key)?;
            self.plans.insert(key, plan);
        }
        let plan = &self.plans[&key];
        let (alpha, beta) = (1.0f32, 0.0f32);
        let ws = dptr(&self.workspace, stream);
        let err = |source| CudaError::BlasLt {
            what: "a bf16 GEMM",
            source,
        };
        // SAFETY: the plan's layouts describe w ([n_out, n_in] bf16, read transposed), x
        // ([batch, n_in] bf16) and y ([batch, n_out] of `out`), which the caller sized; beta is
        // 0, so C (given as y) is not read; the bias pointer in the descriptor holds n_out
        // values of `out`'s type; the workspace is WORKSPACE bytes, as the preference said; the
        // stream orders every use of these buffers.
        unsafe {
            lt::matmul(
                self.handle,
                plan.desc,
                (&alpha) as *const f32 as *const _,
                (&beta) as *const f32 as *const _,
                c.w as *const _,
                plan.a,
                c.x as *const _,
                plan.b,
                c.y as *const _,
                plan.d,
                c.y as *mut _,
                plan.d,
                &plan.algo,
                ws as *mut _,
                WORKSPACE,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(err)
    }

    /// The descriptors of `k` and the algorithm cuBLASLt's heuristic ranks first for them.
    fn plan(&self, k: &Key) -> Result<Plan> {
        let err = |what| move |source| CudaError::BlasLt { what, source };
        let bf16 = sys::cudaDataType::CUDA_R_16BF;
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(err("creating a matmul descriptor"))?;
        // Made one at a time so that each is destroyed (by the Plan) if a later one fails.
        let mut plan = Plan {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            // SAFETY: a plain-data struct of integers; the heuristic overwrites it below.
            algo: unsafe { std::mem::zeroed() },
        };
        let layout = |t, rows: usize, cols: usize| {
            lt::create_matrix_layout(t, rows as u64, cols as u64, rows as i64)
                .map_err(err("creating a matrix layout"))
        };
        // Column-major: A = W^T read from [n_in, n_out] (ld n_in), B = x^T [n_in, batch],
        // D = y^T [n_out, batch].
        plan.a = layout(bf16, k.n_in, k.n_out)?;
        plan.b = layout(bf16, k.n_in, k.batch)?;
        plan.d = layout(k.out.cuda(), k.n_out, k.batch)?;
        let set = |attr, ptr: *const std::ffi::c_void, size| {
            // SAFETY: `desc` is live; `ptr` points to `size` bytes of the attribute's type.
            unsafe { lt::set_matmul_desc_attribute(plan.desc, attr, ptr, size) }
                .map_err(err("setting a matmul attribute"))
        };
        use sys::cublasLtMatmulDescAttributes_t as A;
        let trans_a: i32 = 1; // CUBLAS_OP_T
        set(
            A::CUBLASLT_MATMUL_DESC_TRANSA,
            (&trans_a) as *const _ as *const _,
            std::mem::size_of_val(&trans_a),
        )?;
        use sys::cublasLtEpilogue_t as E;
        let epilogue = match (k.bias != 0, k.relu) {
            (true, true) => E::CUBLASLT_EPILOGUE_RELU_BIAS,
            (true, false) => E::CUBLASLT_EPILOGUE_BIAS,
            (false, true) => E::CUBLASLT_EPILOGUE_RELU,
            (false, false) => E::CUBLASLT_EPILOGUE_DEFAULT,
        };
        set(
            A::CUBLASLT_MATMUL_DESC_EPILOGUE,
            (&epilogue) as *const _ as *const _,
            std::mem::size_of_val(&epilogue),
        )?;
        if k.bias != 0 {
            set(
                A::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                (&k.bias) as *const u64 as *const _,
                std::mem::size_of::<u64>(),
            )?;
            let bias_type = k.out.cuda();
            set(
                A::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                (&bias_type) as *const _ as *const _,
                std::mem::size_of_val(&bias_type),
            )?;
        }
        let pref = lt::create_matmul_pref().map_err(err("creating a preference"))?;
        let ws = WORKSPACE as u64;
        // SAFETY: `pref` is live; the attribute is a u64 of bytes.
        let found = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws) as *const u64 as *const _,
                std::mem::size_of::<u64>(),
            )
            .and_then(|()| {
                lt::get_matmul_algo_heuristic(
                    self.handle,
                    plan.desc,
                    plan.a,
                    plan.b,
                    plan.d,
                    plan.d,
                    pref,
                )
            })
        };
        // SAFETY: created above, destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(pref) };
        plan.algo = found
            .map_err(err("finding an algorithm (no bf16 GEMM for this shape?)"))?
            .algo;
        Ok(plan)
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: created in `new`, destroyed once; its plans are gone.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// f32 values as bf16 bits, rounded to nearest even (as PyTorch's cast and the CUDA kernels'
/// `f32_to_bf16`).
pub(crate) fn to_bf16(v: &[f32]) -> Vec<u16> {
    v.iter()
        .map(|&x| half::bf16::from_f32(x).to_bits())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::to_bf16;

    /// The CUDA kernels' `f32_to_bf16`, written again on the host.
    fn kernel_rounding(f: f32) -> u16 {
        let u = f.to_bits();
        if u & 0x7fff_ffff > 0x7f80_0000 {
            return ((u >> 16) | 0x40) as u16;
        }
        (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
    }

    #[test]
    fn weights_round_to_bf16_as_the_kernels_round_activations() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut v: Vec<f32> = (0..100_000)
            .map(|_| f32::from_bits(rng.random::<u32>()))
            .filter(|f| !f.is_nan())
            .collect();
        v.extend([
            0.0,
            -0.0,
            1.0,
            f32::MAX,
            f32::MIN_POSITIVE,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1.0 + f32::EPSILON,
            // Exactly halfway between two bf16 values: ties go to even.
            f32::from_bits(0x3f80_8000),
            f32::from_bits(0x3f81_8000),
        ]);
        let got = to_bf16(&v);
        for (f, g) in v.iter().zip(&got) {
            assert_eq!(*g, kernel_rounding(*f), "{f:e} ({:#x})", f.to_bits());
        }
        assert!(half::bf16::from_bits(to_bf16(&[f32::NAN])[0]).is_nan());
    }
}
