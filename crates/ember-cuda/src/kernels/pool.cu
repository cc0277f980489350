// Ember's table-batched pooled lookup (EmbeddingBag / SparseLengthsSum) for NVRTC.
//
// One launch pools every bag of a group of features whose tables share a dtype and a load shape.
// A sub-warp of LANES lanes owns one bag (feature f, sample b); each lane owns CH chunks of VEC
// consecutive elements of the output row and loads them with one NB-byte load per row
// (NB = 16 where the row layout allows it). Lanes load the bag's ids cooperatively (one
// coalesced load per LANES ids) and pass them around with shuffles.
//
// The host prepends the configuration:
//   DT        0 f32, 1 f16, 2 bf16, 3 int8 (FBGEMM 8-bit rowwise), 4 int4 (4-bit rowwise)
//   VEC       elements per chunk (1 means the scalar path: element-wise loads)
//   LANES     lanes per bag (1..32, a power of two)
//   CH        chunks per lane (ceil(max dim / (VEC * LANES)) over the group)
//   P         rows loaded ahead before any is accumulated (register prefetch; 1 = none)
//   ID64      1: ids are int64, 0: uint32
//   MODE      0 sum, 1 mean, 2 weighted sum
//   BLOCK     threads per block (the launch's; __launch_bounds__ when there is no register cap)
//   REGCAP    the register cap passed as --maxrregcount (0: none); NVRTC ignores the cap for a
//             kernel with __launch_bounds__, so a capped kernel has none
//   PIN       1: tables use the L2-pinned layout (row map, hot region); 0: plain tables
//
// Inputs are validated on the host (0 <= id < rows, offsets non-decreasing): the kernel trusts
// them, as FBGEMM's does.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

// Must match `FeatDesc::words` in src/embed/tables.rs (7 little-endian words, 56 bytes).
struct FeatDesc {
    const u8* hot;     // rows [0, hot_rows) after renumbering (the L2-pinned region), or null
    const u8* cold;    // rows [hot_rows, rows)
    const int* remap;  // id -> renumbered id, or null
    i64 rows;
    i64 hot_rows;
    int stride;        // bytes per row
    int dim;
    int out_col;       // first output column of this feature
    int kj_feature;    // the feature's index in the batch's offsets
};

#if DT == 0
#define ELEM_BITS 32
#elif DT == 1 || DT == 2
#define ELEM_BITS 16
#elif DT == 3
#define ELEM_BITS 8
#else
#define ELEM_BITS 4
#endif

// Bytes one chunk of VEC elements occupies.
#define NB ((VEC * ELEM_BITS) / 8)
#define NW (NB >= 4 ? NB / 4 : 1)

struct Raw {
    u32 w[NW];
};

__device__ __forceinline__ float f16_to_f32(u32 h) {
    float f;
    unsigned short hs = (unsigned short)h;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(hs));
    return f;
}

__device__ __forceinline__ float bf16_to_f32(u32 h) {
    return __uint_as_float((h & 0xffffu) << 16);
}

// A little-endian f32 at any byte address (int8 rows keep scale and bias right after the codes).
__device__ __forceinline__ float ld_f32_any(const u8* p) {
    if ((((u64)p) & 3) == 0) {
        return __ldg((const float*)p);
    }
    u32 v = (u32)__ldg(p) | ((u32)__ldg(p + 1) << 8) | ((u32)__ldg(p + 2) << 16) |
            ((u32)__ldg(p + 3) << 24);
    return __uint_as_float(v);
}

__device__ __forceinline__ u32 ld_u16_any(const u8* p) {
    return (u32)__ldg(p) | ((u32)__ldg(p + 1) << 8);
}

// Scale and bias of a quantized row (1 and 0 for float dtypes).
__device__ __forceinline__ void scale_bias(const u8* row, int dim, float& sc, float& bi) {
#if DT == 3
    sc = ld_f32_any(row + dim);
    bi = ld_f32_any(row + dim + 4);
#elif DT == 4
    int code_bytes = (dim + 1) / 2;
    sc = f16_to_f32(ld_u16_any(row + code_bytes));
    bi = f16_to_f32(ld_u16_any(row + code_bytes + 2));
#else
    (void)row;
    (void)dim;
    sc = 1.0f;
    bi = 0.0f;
#endif
}

// Loads chunk `c` (elements c*VEC .. c*VEC+VEC) of a row.
__device__ __forceinline__ Raw ld_chunk(const u8* row, int c) {
    Raw r;
#if VEC == 1
    // Scalar path: one element; int4 keeps the whole byte, decode picks the nibble.
#if DT == 0
    r.w[0] = __ldg((const u32*)row + c);
#elif DT == 1 || DT == 2
    r.w[0] = __ldg((const u16*)row + c);
#elif DT == 3
    r.w[0] = __ldg(row + c);
#else
    r.w[0] = __ldg(row + c / 2);
#endif
#else
    const u8* p = row + (i64)c * NB;
#if NB == 16
    uint4 v = __ldg((const uint4*)p);
    r.w[0] = v.x;
    r.w[1] = v.y;
    r.w[2] = v.z;
    r.w[3] = v.w;
#elif NB == 8
    uint2 v = __ldg((const uint2*)p);
    r.w[0] = v.x;
    r.w[1] = v.y;
#elif NB == 4
    r.w[0] = __ldg((const u32*)p);
#else
#error "vector chunks must be 4, 8 or 16 bytes"
#endif
#endif
    return r;
}

// Element i (0 <= i < VEC) of a loaded chunk `c`, decoded to f32.
__device__ __forceinline__ float decode(const Raw& r, int c, int i, float sc, float bi) {
#if VEC == 1
    (void)i;
#if DT == 0
    return __uint_as_float(r.w[0]);
#elif DT == 1
    return f16_to_f32(r.w[0]);
#elif DT == 2
    return bf16_to_f32(r.w[0]);
#elif DT == 3
    return fmaf((float)r.w[0], sc, bi);
#else
    return fmaf((float)((r.w[0] >> (4 * (c & 1))) & 0xfu), sc, bi);
#endif
#else
    (void)c;
#if DT == 0
    return __uint_as_float(r.w[i]);
#elif DT == 1
    return f16_to_f32(r.w[i / 2] >> (16 * (i % 2)));
#elif DT == 2
    return bf16_to_f32(r.w[i / 2] >> (16 * (i % 2)));
#elif DT == 3
    return fmaf((float)((r.w[i / 4] >> (8 * (i % 4))) & 0xffu), sc, bi);
#else
    return fmaf((float)((r.w[i / 8] >> (4 * (i % 8))) & 0xfu), sc, bi);
#endif
#endif
}

// PIN 0: tables in one region each (no renumbering); the pinned layout's branch and row map
// cost 8 registers on sm_90 (48 vs 40 for f32 dim 128), so kernels without it leave them out.
#ifndef PIN
#define PIN 1
#endif

__device__ __forceinline__ const u8* row_ptr(const FeatDesc& d, i64 id) {
#if PIN
    if (d.remap != nullptr) {
        id = __ldg(d.remap + id);
    }
    if (id < d.hot_rows) {
        return d.hot + id * d.stride;
    }
    return d.cold + (id - d.hot_rows) * d.stride;
#else
    return d.cold + id * d.stride;
#endif
}

#if ID64
typedef i64 id_t_;
#else
typedef u32 id_t_;
#endif

#if REGCAP > 0
#define BOUNDS
#else
#define BOUNDS __launch_bounds__(BLOCK)
#endif

extern "C" __global__ void BOUNDS ember_pool(const FeatDesc* __restrict__ feats, int n_feat,
                                             int batch, const i64* __restrict__ offsets,
                                             const id_t_* __restrict__ ids,
                                             const float* __restrict__ weights,
                                             float* __restrict__ out, int out_stride) {
    const int bags_per_block = blockDim.x / LANES;
    const i64 bag = (i64)blockIdx.x * bags_per_block + threadIdx.x / LANES;
    if (bag >= (i64)n_feat * batch) {
        return;  // whole sub-warps leave together: the shuffles below use the sub-warp's mask
    }
    const int lane = threadIdx.x % LANES;
#if LANES == 32
    const unsigned mask = 0xffffffffu;
#else
    const unsigned mask = ((1u << LANES) - 1u) << ((threadIdx.x % 32) / LANES * LANES);
#endif
    const int f = (int)(bag / batch);
    const int b = (int)(bag % batch);
    const FeatDesc d = feats[f];
    const i64 start = offsets[(i64)d.kj_feature * batch + b];
    const i64 end = offsets[(i64)d.kj_feature * batch + b + 1];
    const int chunks = d.dim / VEC;

    float acc[CH][VEC];
#pragma unroll
    for (int c = 0; c < CH; c++) {
#pragma unroll
        for (int i = 0; i < VEC; i++) {
            acc[c][i] = 0.0f;
        }
    }

    for (i64 j0 = start; j0 < end; j0 += LANES) {
        // One coalesced load of up to LANES ids (and weights), then shuffles.
        const int cnt = (int)min((i64)LANES, end - j0);
        i64 my_id = 0;
        float my_w = 1.0f;
        if (lane < cnt) {
            my_id = (i64)ids[j0 + lane];
#if MODE == 2
            my_w = weights[j0 + lane];
#endif
        }
        for (int k0 = 0; k0 < cnt; k0 += P) {
            Raw buf[P][CH];
            float sc[P], bi[P], wk[P];
            // Issue the loads of P rows before using any of them.
#pragma unroll
            for (int k = 0; k < P; k++) {
                const int kk = k0 + k;
                const i64 id = __shfl_sync(mask, my_id, kk < LANES ? kk : 0, LANES);
                wk[k] = __shfl_sync(mask, my_w, kk < LANES ? kk : 0, LANES);
                sc[k] = 1.0f;
                bi[k] = 0.0f;
                if (kk < cnt) {
                    const u8* row = row_ptr(d, id);
                    scale_bias(row, d.dim, sc[k], bi[k]);
#pragma unroll
                    for (int c = 0; c < CH; c++) {
                        const int chunk = lane + c * LANES;
                        if (chunk < chunks) {
                            buf[k][c] = ld_chunk(row, chunk);
                        }
                    }
                }
            }
#pragma unroll
            for (int k = 0; k < P; k++) {
                if (k0 + k < cnt) {
#pragma unroll
                    for (int c = 0; c < CH; c++) {
                        const int chunk = lane + c * LANES;
                        if (chunk < chunks) {
#pragma unroll
                            for (int i = 0; i < VEC; i++) {
                                const float v = decode(buf[k][c], chunk, i, sc[k], bi[k]);
#if MODE == 2
                                acc[c][i] = fmaf(wk[k], v, acc[c][i]);
#else
                                acc[c][i] += v;
#endif
                            }
                        }
                    }
                }
            }
        }
    }

    float scale = 1.0f;
#if MODE == 1
    if (end > start) {
        scale = 1.0f / (float)(end - start);
    }
#endif
    float* o = out + (i64)b * out_stride + d.out_col;
#pragma unroll
    for (int c = 0; c < CH; c++) {
        const int chunk = lane + c * LANES;
        if (chunk < chunks) {
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                o[chunk * VEC + i] = acc[c][i] * scale;
            }
        }
    }
}
