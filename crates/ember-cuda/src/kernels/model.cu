// Ember's dense-part kernels (NVRTC): bias and ReLU after cuBLAS GEMMs, the dot and concatenation
// interactions, and the DCNv2 cross update. Row-major [batch, width] activations throughout.

typedef long long i64;

// y[b, c] += bias[c]; then max(y, 0) when relu.
extern "C" __global__ void ember_bias_act(float* y, const float* bias, int n, i64 total, int relu) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) {
        return;
    }
    float v = y[i] + bias[i % n];
    if (relu) {
        v = fmaxf(v, 0.0f);
    }
    y[i] = v;
}

// dst[b, col .. col + width] = src[b, 0 .. width].
extern "C" __global__ void ember_copy_cols(const float* src, int width, float* dst, int dst_stride,
                                           int col, int batch) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)batch * width) {
        return;
    }
    const i64 b = i / width;
    const int c = (int)(i % width);
    dst[b * dst_stride + col + c] = src[i];
}

// One block per sample: T = [x_b; pooled_b] (n rows of d), out[b, 0..d] = x_b, then
// out[b, d + p] = <T[i_p], T[j_p]> for every listed pair. T sits in shared memory when it fits
// (use_smem), else it is read from global memory.
extern "C" __global__ void ember_dot_interact(const float* x, const float* pooled, int d, int n,
                                              const int* pairs, int n_pairs, float* out,
                                              int top_in, int use_smem) {
    extern __shared__ float t[];
    const i64 b = blockIdx.x;
    const float* xb = x + b * d;
    const float* pb = pooled + b * (i64)(n - 1) * d;
    if (use_smem) {
        for (int k = threadIdx.x; k < n * d; k += blockDim.x) {
            t[k] = k < d ? xb[k] : pb[k - d];
        }
        __syncthreads();
    }
    float* ob = out + b * top_in;
    for (int k = threadIdx.x; k < d; k += blockDim.x) {
        ob[k] = xb[k];
    }
    for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) {
        const int i = pairs[2 * p];
        const int j = pairs[2 * p + 1];
        const float* ri = use_smem ? t + i * d : (i == 0 ? xb : pb + (i64)(i - 1) * d);
        const float* rj = use_smem ? t + j * d : (j == 0 ? xb : pb + (i64)(j - 1) * d);
        float s = 0.0f;
        for (int k = 0; k < d; k++) {
            s = fmaf(ri[k], rj[k], s);
        }
        ob[d + p] = s;
    }
}

// DCNv2: xl += x0 * (wide + bias), elementwise over [batch, n].
extern "C" __global__ void ember_cross_update(float* xl, const float* x0, const float* wide,
                                              const float* bias, int n, i64 total) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) {
        xl[i] = fmaf(x0[i], wide[i] + bias[i % n], xl[i]);
    }
}

// ----- bf16 dense layers (cuBLASLt GEMMs on tensor cores, bias and ReLU in their epilogue) -----
// bf16 values travel as their 16 bits (unsigned short); no header needed.

// f32 -> bf16, rounding to nearest even (NaN stays NaN), as PyTorch's cast.
__device__ __forceinline__ unsigned short f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (unsigned short)((u >> 16) | 0x40);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

// y = bf16(x), [batch, width] at x's row stride into a packed [batch, width].
extern "C" __global__ void ember_to_bf16(const float* x, unsigned short* y, i64 total) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) {
        y[i] = f32_to_bf16(x[i]);
    }
}

// DCNv2 with the bias added by the GEMM's epilogue: xl += x0 * wide, and xl16 = bf16(xl), the
// next GEMM's input (the next layer's V, or the top MLP's first layer), in the same pass.
extern "C" __global__ void ember_cross_update_bf16(float* xl, const float* x0, const float* wide,
                                                   unsigned short* xl16, i64 total) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) {
        const float v = fmaf(x0[i], wide[i], xl[i]);
        xl[i] = v;
        xl16[i] = f32_to_bf16(v);
    }
}

// ----- inputs checked on the device (batches handed over in page-locked memory) -----

// Feature f's ids are ids[starts[f] .. starts[f + 1]); an id not below rows[f] (as unsigned:
// negative ids are above any row count) is replaced by 0, so that no kernel reads outside a
// table, and the first such position is kept in bad[0] (the batch's scores are then withheld).
// Blocks with blockIdx.y == nf look for a dense value that is not finite: bad[1].
extern "C" __global__ void ember_check_inputs(long long* ids, const long long* starts,
                                              const long long* rows, int nf, const float* dense,
                                              i64 n_dense, unsigned long long* bad) {
    const int f = blockIdx.y;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const i64 first = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (f < nf) {
        const unsigned long long r = (unsigned long long)rows[f];
        const i64 end = starts[f + 1];
        for (i64 i = starts[f] + first; i < end; i += stride) {
            if ((unsigned long long)ids[i] >= r) {
                ids[i] = 0;
                atomicMin(&bad[0], (unsigned long long)i);
            }
        }
    } else {
        for (i64 i = first; i < n_dense; i += stride) {
            if ((__float_as_uint(dense[i]) & 0x7f800000u) == 0x7f800000u) {
                atomicMin(&bad[1], (unsigned long long)i);
            }
        }
    }
}
