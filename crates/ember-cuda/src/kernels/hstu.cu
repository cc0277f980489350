// Ember's HSTU kernels (NVRTC), compiled after model.cu (i64, f32_to_bf16, ember_to_bf16,
// ember_bias_act). QK and HID, the per-head widths of q / k and of u / v, are #defined in front.
//
// Activations are row-major f32 [tokens, width] unless named *16 (bf16 bits). The steps follow
// crates/ember-model/src/hstu/forward.rs; each kernel names the CPU function it matches.

#ifndef QK
#error "QK (the per-head width of q and k) must be defined"
#endif
#ifndef HID
#error "HID (the per-head width of u and v) must be defined"
#endif

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }

// Mean and 1 / sqrt(var + eps) of x[0 .. n) (biased variance, two passes), by one whole warp.
__device__ __forceinline__ void warp_moments(const float* x, int n, float eps, float* mean,
                                             float* rstd) {
    const int lane = threadIdx.x & 31;
    float s = 0.0f;
    for (int i = lane; i < n; i += 32) {
        s += x[i];
    }
    const float m = warp_sum(s) / (float)n;
    float v = 0.0f;
    for (int i = lane; i < n; i += 32) {
        const float d = x[i] - m;
        v = fmaf(d, d, v);
    }
    v = warp_sum(v) / (float)n;
    *mean = m;
    *rstd = 1.0f / sqrtf(v + eps);
}

// One warp per row (blocks of 256 threads: 8 rows). y = layer_norm(x) * w + b (swish 0), or
// y = x * sigmoid(layer_norm(x) * w + b) (swish 1, the reference's SwishLayerNorm). y may be x.
// (Norm::rows_in_place, Norm::swish_rows_in_place, Norm::row)
extern "C" __global__ void hstu_norm(const float* x, int ldx, float* y, int ldy, const float* w,
                                     const float* b, float eps, int rows, int n, int swish) {
    const i64 r = (i64)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (r >= rows) {
        return;
    }
    const float* xr = x + r * ldx;
    float* yr = y + r * ldy;
    float mean, rstd;
    warp_moments(xr, n, eps, &mean, &rstd);
    for (int i = threadIdx.x & 31; i < n; i += 32) {
        const float v = xr[i];
        const float z = (v - mean) * rstd * w[i] + b[i];
        yr[i] = swish ? v * (1.0f / (1.0f + expf(-z))) : z;
    }
}

// out[r, s * td + e] = emb[row, pairs[2s] + e] (+ emb[row, pairs[2s + 1] + e] unless that is
// -1), row = rows[r] (rows null: r). The merged post id and additional features (the history's
// row at history tokens, the candidate's at candidates, the other an empty bag), and the
// candidates' item rows. (forward.rs `inputs`, head.rs)
extern "C" __global__ void hstu_gather(const float* emb, int total, const int* rows, int n_rows,
                                       const int* pairs, int segs, int td, float* out) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const i64 width = (i64)segs * td;
    if (i >= (i64)n_rows * width) {
        return;
    }
    const i64 r = i / width;
    const int c = (int)(i % width);
    const int s = c / td;
    const int e = c % td;
    const i64 row = rows ? (i64)rows[r] : r;
    const float* src = emb + row * total;
    const int a = pairs[2 * s];
    const int b2 = pairs[2 * s + 1];
    float v = src[a + e];
    if (b2 >= 0) {
        v += src[b2 + e];
    }
    out[i] = v;
}

// One block per contextual slot item (token, slot, col): x[token] = bias[slot] + row @ W[slot],
// the row being emb[token, col .. col + td) (col -1: the bias alone). (forward.rs `contextual`)
extern "C" __global__ void hstu_contextual(float* x, int d, const float* emb, int total,
                                           const int* items, const float* w, const float* b,
                                           int td) {
    const int token = items[3 * blockIdx.x];
    const int slot = items[3 * blockIdx.x + 1];
    const int col = items[3 * blockIdx.x + 2];
    const float* row = emb + (i64)token * total + col;
    const float* wm = w + (i64)slot * td * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float o = b[(i64)slot * d + c];
        if (col >= 0) {
            for (int i = 0; i < td; i++) {
                o += row[i] * wm[(i64)i * d + c];
            }
        }
        x[(i64)token * d + c] = o;
    }
}

// x = x * alpha + (times[bucket[t]] + positions[pos[t]]), [tokens, d]. (forward.rs `encodings`)
extern "C" __global__ void hstu_encode(float* x, int d, const int* pos, const int* bucket,
                                       const float* positions, const float* times, float alpha,
                                       i64 total) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) {
        return;
    }
    const i64 t = i / d;
    const int c = (int)(i % d);
    const float te = times[(i64)bucket[t] * d + c];
    const float pe = positions[(i64)pos[t] * d + c];
    x[i] = __fadd_rn(__fmul_rn(x[i], alpha), __fadd_rn(te, pe));
}

// u = silu(u) on the first n columns of each [tokens, w] row; with uvqk16, the whole row also as
// bf16 (attention's inputs on tensor cores). (forward.rs `stu_layer`)
extern "C" __global__ void hstu_silu_u(float* uvqk, int w, int n, unsigned short* uvqk16,
                                       i64 total) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) {
        return;
    }
    float v = uvqk[i];
    if ((int)(i % w) < n) {
        v = silu_f(v);
        uvqk[i] = v;
    }
    if (uvqk16) {
        uvqk16[i] = f32_to_bf16(v);
    }
}

// One warp per token: y = [u | a | u * norm(a)] with n = heads * HID values each; norm is the
// output layer norm over the row (group 0, weights per value) or per head (group 1, one weight
// and bias per head). (forward.rs `stu_layer`)
extern "C" __global__ void hstu_assemble(const float* uvqk, int w, const float* attn, float* y,
                                         const float* nw, const float* nb, float eps, int group,
                                         int heads, int rows) {
    const i64 r = (i64)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (r >= rows) {
        return;
    }
    const int lane = threadIdx.x & 31;
    const int n = heads * HID;
    const float* u = uvqk + r * w;
    const float* a = attn + r * n;
    float* yr = y + r * 3 * n;
    for (int i = lane; i < n; i += 32) {
        yr[i] = u[i];
        yr[n + i] = a[i];
    }
    if (group) {
        for (int h = 0; h < heads; h++) {
            float mean, rstd;
            warp_moments(a + h * HID, HID, eps, &mean, &rstd);
            for (int i = lane; i < HID; i += 32) {
                const int c = h * HID + i;
                yr[2 * n + c] = u[c] * ((a[c] - mean) * rstd * nw[h] + nb[h]);
            }
        }
    } else {
        float mean, rstd;
        warp_moments(a, n, eps, &mean, &rstd);
        for (int i = lane; i < n; i += 32) {
            yr[2 * n + i] = ((a[i] - mean) * rstd * nw[i] + nb[i]) * u[i];
        }
    }
}

// x += y + bias (the output projection plus its bias, added to the residual).
extern "C" __global__ void hstu_residual(float* x, const float* y, const float* bias, int n,
                                         i64 total) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) {
        x[i] += y[i] + bias[i % n];
    }
}

// out[r] = [x[rows[r], 0 .. d) | extra[r, 0 .. ne)]: the candidates' rows, with their time
// features when ne > 0. (head.rs)
extern "C" __global__ void hstu_rows(const float* x, int d, const int* rows, int n,
                                     const float* extra, int ne, float* out) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const int width = d + ne;
    if (i >= (i64)n * width) {
        return;
    }
    const i64 r = i / width;
    const int c = (int)(i % width);
    out[i] = c < d ? x[(i64)rows[r] * d + c] : extra[r * ne + (c - d)];
}

// One warp per row: x /= max(||x||, 1e-6). (head.rs, the L2 postprocessor)
extern "C" __global__ void hstu_l2(float* x, int n, int rows) {
    const i64 r = (i64)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (r >= rows) {
        return;
    }
    float* xr = x + r * n;
    float s = 0.0f;
    for (int i = threadIdx.x & 31; i < n; i += 32) {
        s = fmaf(xr[i], xr[i], s);
    }
    const float norm = fmaxf(sqrtf(warp_sum(s)), 1e-6f);
    for (int i = threadIdx.x & 31; i < n; i += 32) {
        xr[i] /= norm;
    }
}

// x += y, elementwise.
extern "C" __global__ void hstu_add(float* x, const float* y, i64 total) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) {
        x[i] += y[i];
    }
}

// x *= y, elementwise.
extern "C" __global__ void hstu_mul(float* x, const float* y, i64 total) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) {
        x[i] *= y[i];
    }
}

// ----- attention (crates/ember-model/src/hstu/attention/mod.rs, the spec) -----
//
// out[i, h] = sum over valid j of silu(alpha <q_i, k_j>) / norm * v_j, valid(i, j) = (i == j)
// or min(i, M) > min(j, M), M = len - candidates. Sequences: seq[4s .. 4s + 4) = (first token,
// len, M, unused), norm[s]; tiles[2k .. 2k + 2) = (sequence, first row), 64 rows a tile; grid
// (tiles, heads, key chunks). Rows [r0, r1] need keys [0, min(r1 + 1, M)) and, for candidate
// rows, their own keys: [max(that end, r0, M), r1 + 1); a block takes the part of those ranges
// inside its chunk [z * chunk, (z + 1) * chunk) (chunk a multiple of 64). Keys outside a row's
// set are masked. The sum has no normalisation (no softmax), so chunks add up: each block adds
// its partial sums into `out`, zeroed before the launch.

__device__ __forceinline__ bool attn_valid(int i, int j, int m, int len) {
    return j < len && (i == j || min(i, m) > min(j, m));
}

// The key ranges [a0, a1) and [b0, b1) that rows [r0, r1] need, clipped to [c0, c1), starting
// at multiples of `step` (the keys a step reads; masks cut the rest).
__device__ __forceinline__ void key_ranges(int r0, int r1, int m, int step, int c0, int c1,
                                           int* a0, int* a1, int* b0, int* b1) {
    const int a_end = min(r1 + 1, m);
    const int b_start = max(((a_end + step - 1) / step) * step, (max(r0, m) / step) * step);
    *a0 = c0;
    *a1 = min(a_end, c1);
    *b0 = max(b_start, c0);
    *b1 = min(r1 + 1, c1);
}

// f32 on CUDA cores: 4 lanes per (row, head), each holding a quarter of q and of the output;
// 8 rows a warp, 64 rows a block (256 threads).
#define QL ((QK + 3) / 4)
#define HL ((HID + 3) / 4)
extern "C" __global__ void __launch_bounds__(256)
hstu_attn_f32(const float* uvqk, int w, const int* seq, const float* norms, const int* tiles,
              int heads, float alpha, int chunk, float* out) {
    const int s = tiles[2 * blockIdx.x];
    const int start = seq[4 * s];
    const int len = seq[4 * s + 1];
    const int m = seq[4 * s + 2];
    const float inv = 1.0f / norms[s];
    const int h = blockIdx.y;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int q4 = lane & 3;
    const int w0 = tiles[2 * blockIdx.x + 1] + warp * 8;
    if (w0 >= len) {
        return;
    }
    const int w1 = min(w0 + 7, len - 1);
    int ranges[4];
    key_ranges(w0, w1, m, 1, blockIdx.z * chunk, (blockIdx.z + 1) * chunk, &ranges[0],
               &ranges[1], &ranges[2], &ranges[3]);
    if (ranges[0] >= ranges[1] && ranges[2] >= ranges[3]) {
        return;
    }
    const int i = w0 + (lane >> 2);
    const bool live = i < len;
    const int qcol = 2 * heads * HID + h * QK;
    const int kcol = qcol + heads * QK;
    const int vcol = heads * HID + h * HID;
    float q[QL];
    float o[HL];
    const float* qr = uvqk + (i64)(start + (live ? i : w1)) * w + qcol;
#pragma unroll
    for (int k = 0; k < QL; k++) {
        const int d = q4 * QL + k;
        q[k] = d < QK ? qr[d] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < HL; k++) {
        o[k] = 0.0f;
    }
    for (int pass = 0; pass < 2; pass++) {
        const int j1 = ranges[2 * pass + 1];
        for (int j = ranges[2 * pass]; j < j1; j++) {
            const float* kr = uvqk + (i64)(start + j) * w + kcol;
            float dot = 0.0f;
#pragma unroll
            for (int k = 0; k < QL; k++) {
                const int d = q4 * QL + k;
                dot = fmaf(q[k], d < QK ? kr[d] : 0.0f, dot);
            }
            dot += __shfl_xor_sync(0xffffffffu, dot, 1);
            dot += __shfl_xor_sync(0xffffffffu, dot, 2);
            const float p = live && attn_valid(i, j, m, len) ? silu_f(alpha * dot) * inv : 0.0f;
            if (p != 0.0f) {
                const float* vr = uvqk + (i64)(start + j) * w + vcol;
#pragma unroll
                for (int k = 0; k < HL; k++) {
                    const int c = q4 * HL + k;
                    if (c < HID) {
                        o[k] = fmaf(p, vr[c], o[k]);
                    }
                }
            }
        }
    }
    if (live) {
        float* orow = out + (i64)(start + i) * heads * HID + h * HID;
#pragma unroll
        for (int k = 0; k < HL; k++) {
            const int c = q4 * HL + k;
            if (c < HID) {
                atomicAdd(orow + c, o[k]);
            }
        }
    }
}

// bf16 on tensor cores (mma.sync m16n8k16, f32 accumulation): 16 query rows a warp, 64 a block
// (128 threads). The block steps over 64 keys at a time, their k and v rows copied to shared
// memory by all its threads (16-byte loads) and read there by every warp; a warp computes the
// 16-key pieces its own rows need. The scores' accumulator fragments are the A fragments of the
// second product (P V) as they are, so P never leaves registers. Fragment layouts (PTX ISA,
// mma.m16n8k16 with .bf16): g = lane / 4, t = lane % 4; A regs (row g, cols 2t..2t+1),
// (row g+8, cols 2t..), (row g, cols 2t+8..), (row g+8, cols 2t+8..); B regs (k 2t..2t+1, n g),
// (k 2t+8..2t+9, n g); C (row g, cols 2t..2t+1), (row g+8, cols 2t..2t+1). A register holds
// the lower-indexed element in its low 16 bits.
// Needs QK % 16 == 0 and HID % 8 == 0 (then every row offset is a multiple of 16 bytes);
// uvqk16 has 64 finite rows after the last token (their values are multiplied by masked, zero,
// scores).
__device__ __forceinline__ void mma_bf16(float* c, unsigned a0, unsigned a1, unsigned a2,
                                         unsigned a3, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned ld2(const unsigned short* p) {
    return *reinterpret_cast<const unsigned*>(p);
}

__device__ __forceinline__ unsigned pack2(unsigned short lo, unsigned short hi) {
    return (unsigned)lo | ((unsigned)hi << 16);
}

#if QK % 16 == 0 && HID % 8 == 0
// Keys a step, and the shared rows' strides (bf16; 8 more than a row: conflict-free reads).
#define KT 64
#define KS (QK + 8)
#define VS (HID + 8)

// What both bf16 kernels share. q's A fragments of rows g and g + 8 from `qlo` (row g's q):
// QK / 16 steps of 4 registers.
__device__ __forceinline__ void q_frags(const unsigned short* qlo, int w, int t,
                                        unsigned (&qa)[QK / 16][4]) {
    const unsigned short* qhi = qlo + (i64)8 * w;
#pragma unroll
    for (int ks_ = 0; ks_ < QK / 16; ks_++) {
        const int c = ks_ * 16 + 2 * t;
        qa[ks_][0] = ld2(qlo + c);
        qa[ks_][1] = ld2(qhi + c);
        qa[ks_][2] = ld2(qlo + c + 8);
        qa[ks_][3] = ld2(qhi + c + 8);
    }
}

// The scores of keys j .. j + 16 (two n8 halves) for rows ilo and ihi: silu, scale and mask in
// place, packed as P's A fragment.
__device__ __forceinline__ void p_frag(const float (&sc)[2][4], int j, int t, int ilo, int ihi,
                                       int m, int len, float alpha, float inv, unsigned (&pa)[4]) {
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int jj = j + half * 8 + 2 * t;
        float p[4];
        p[0] = attn_valid(ilo, jj, m, len) ? silu_f(alpha * sc[half][0]) * inv : 0.0f;
        p[1] = attn_valid(ilo, jj + 1, m, len) ? silu_f(alpha * sc[half][1]) * inv : 0.0f;
        p[2] = attn_valid(ihi, jj, m, len) ? silu_f(alpha * sc[half][2]) * inv : 0.0f;
        p[3] = attn_valid(ihi, jj + 1, m, len) ? silu_f(alpha * sc[half][3]) * inv : 0.0f;
        pa[2 * half] = pack2(f32_to_bf16(p[0]), f32_to_bf16(p[1]));
        pa[2 * half + 1] = pack2(f32_to_bf16(p[2]), f32_to_bf16(p[3]));
    }
}

// O += P V for the output block at column c of shared v rows `vs` (keys 0 .. 16 of the piece),
// the B fragments read as 2-byte loads (keys 2t, 2t + 1 | 2t + 8, 2t + 9; column g).
__device__ __forceinline__ void pv_block(float (&o)[4], const unsigned (&pa)[4],
                                         const unsigned short* vs, int g, int t, int c) {
    const unsigned short* v0 = vs + (2 * t) * VS + g;
    const unsigned short* v1 = v0 + VS;
    const unsigned short* v8 = v0 + 8 * VS;
    const unsigned short* v9 = v8 + VS;
    mma_bf16(o, pa[0], pa[1], pa[2], pa[3], pack2(v0[c], v1[c]), pack2(v8[c], v9[c]));
}

// Adds the warp's output rows ilo and ihi (those <= r1) of head h into `out`.
__device__ __forceinline__ void add_out(const float (&o)[HID / 8][4], float* out, int start,
                                        int ilo, int ihi, int r1, int heads, int h, int t) {
    const int stride = heads * HID;
#pragma unroll
    for (int nb = 0; nb < HID / 8; nb++) {
        const int c = h * HID + nb * 8 + 2 * t;
        if (ilo <= r1) {
            float* dst = out + (i64)(start + ilo) * stride + c;
            atomicAdd(dst, o[nb][0]);
            atomicAdd(dst + 1, o[nb][1]);
        }
        if (ihi <= r1) {
            float* dst = out + (i64)(start + ihi) * stride + c;
            atomicAdd(dst, o[nb][2]);
            atomicAdd(dst + 1, o[nb][3]);
        }
    }
}
extern "C" __global__ void __launch_bounds__(128)
hstu_attn_bf16(const unsigned short* uvqk16, int w, const int* seq, const float* norms,
               const int* tiles, int heads, float alpha, int chunk, float* out) {
    __shared__ __align__(16) unsigned short ks[KT * KS];
    __shared__ __align__(16) unsigned short vs[KT * VS];
    const int s = tiles[2 * blockIdx.x];
    const int start = seq[4 * s];
    const int len = seq[4 * s + 1];
    const int m = seq[4 * s + 2];
    const float inv = 1.0f / norms[s];
    const int h = blockIdx.y;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2;
    const int t = lane & 3;
    const int t0 = tiles[2 * blockIdx.x + 1];
    const int c0 = blockIdx.z * chunk;
    const int c1 = c0 + chunk;
    // The block's steps (every warp's keys) and this warp's own 16-key pieces.
    int br[4];
    key_ranges(t0, min(t0 + 63, len - 1), m, KT, c0, c1, &br[0], &br[1], &br[2], &br[3]);
    if (br[0] >= br[1] && br[2] >= br[3]) {
        return;
    }
    const int r0 = t0 + warp * 16;
    const int r1 = min(r0 + 15, len - 1);
    int wr[4];
    key_ranges(r0, r1, m, 16, c0, c1, &wr[0], &wr[1], &wr[2], &wr[3]);
    const bool active = r0 < len;
    const int qcol = 2 * heads * HID + h * QK;
    const int kcol = qcol + heads * QK;
    const int vcol = heads * HID + h * HID;
    // q's A fragments, QK / 16 steps of 4 registers.
    unsigned qa[QK / 16][4];
    q_frags(uvqk16 + (i64)(start + (active ? r0 : t0) + g) * w + qcol, w, t, qa);
    float o[HID / 8][4];
#pragma unroll
    for (int nb = 0; nb < HID / 8; nb++) {
        o[nb][0] = o[nb][1] = o[nb][2] = o[nb][3] = 0.0f;
    }
    const int ilo = r0 + g;
    const int ihi = ilo + 8;
    for (int pass = 0; pass < 2; pass++) {
        const int j_end = br[2 * pass + 1];
        for (int j0 = br[2 * pass]; j0 < j_end; j0 += KT) {
            __syncthreads();  // every warp is done with the last step's rows
            // k and v rows j0 .. j0 + KT to shared memory, 8 bf16 (16 bytes) a load.
            for (int e = threadIdx.x; e < KT * (QK / 8); e += 128) {
                const int r = e / (QK / 8);
                const int c = (e % (QK / 8)) * 8;
                *reinterpret_cast<uint4*>(ks + r * KS + c) = *reinterpret_cast<const uint4*>(
                    uvqk16 + (i64)(start + j0 + r) * w + kcol + c);
            }
            for (int e = threadIdx.x; e < KT * (HID / 8); e += 128) {
                const int r = e / (HID / 8);
                const int c = (e % (HID / 8)) * 8;
                *reinterpret_cast<uint4*>(vs + r * VS + c) = *reinterpret_cast<const uint4*>(
                    uvqk16 + (i64)(start + j0 + r) * w + vcol + c);
            }
            __syncthreads();
            if (!active) {
                continue;
            }
#pragma unroll 1
            for (int p16 = 0; p16 < KT; p16 += 16) {
                const int j = j0 + p16;
                const bool need = (j < wr[1] && j + 16 > wr[0]) || (j < wr[3] && j + 16 > wr[2]);
                if (!need) {
                    continue;
                }
                // Scores of the 16 keys j .. j + 16: two n8 halves.
                float sc[2][4];
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    sc[half][0] = sc[half][1] = sc[half][2] = sc[half][3] = 0.0f;
                    const unsigned short* kr = ks + (p16 + half * 8 + g) * KS;
#pragma unroll
                    for (int ks_ = 0; ks_ < QK / 16; ks_++) {
                        const int c = ks_ * 16 + 2 * t;
                        mma_bf16(sc[half], qa[ks_][0], qa[ks_][1], qa[ks_][2], qa[ks_][3],
                                 ld2(kr + c), ld2(kr + c + 8));
                    }
                }
                // silu, scale and mask in place; then the scores as P's A fragment.
                unsigned pa[4];
                p_frag(sc, j, t, ilo, ihi, m, len, alpha, inv, pa);
                // O += P V, an n8 block at a time.
#pragma unroll
                for (int nb = 0; nb < HID / 8; nb++) {
                    pv_block(o[nb], pa, vs + p16 * VS, g, t, nb * 8);
                }
            }
        }
    }
    if (!active) {
        return;
    }
    add_out(o, out, start, ilo, ihi, r1, heads, h, t);
}
#endif
