// HSTU attention in bf16 on tensor cores, second version (`hstu_attn_bf16_v2`), compiled after
// hstu.cu (key_ranges, mma_bf16, ld2, KS, VS, and the parts both kernels share: q_frags, p_frag,
// pv_block, add_out). The same sums as
// `hstu_attn_bf16` (the spec: crates/ember-model/src/hstu/attention/mod.rs), the same grid,
// tiles and key chunks; it differs in how the keys reach the tensor cores:
//
// - k and v tiles of 32 keys are copied to shared memory with cp.async (16 bytes a copy, no
//   registers on the way) into two buffers: the next tile's copy is in flight while the warps
//   multiply the current one;
// - the B fragments come from shared memory through ldmatrix: `ldmatrix.x4` gives the k
//   fragments of two 16-wide steps of q.k for 8 keys in one instruction (the first version: 8
//   4-byte loads), and `ldmatrix.x4.trans` the v fragments of two 8-wide column blocks of P V
//   for 16 keys (the first version: 16 2-byte loads).
//
// Fragment layouts (PTX ISA, ldmatrix .m8n8 .b16): the addresses of lanes 8i .. 8i + 7 are
// the 8 rows of matrix i; lane l receives, of matrix i, row l / 4 and columns 2 (l % 4),
// 2 (l % 4) + 1 into register i; with .trans, column l / 4 and rows 2 (l % 4), 2 (l % 4) + 1
// (the lower-indexed element in the low 16 bits, as mma's fragments take them).
// k rows are keys (columns: q.k dims), so matrix i = keys 0..8, dims 8i.. is the B fragment
// register (b0, b1) of the mma steps over dims [0, 16) and [16, 32). v rows are keys (columns:
// output dims), so with .trans matrix (keys 0..8 | 8..16, cols c..c+8) is (b0 | b1) of the
// column block at c.
//
// Needs QK % 16 == 0 and HID % 8 == 0 (as the first version); a q.k step or an output block
// that ldmatrix.x4 does not cover (QK % 32 == 16, HID % 16 == 8) is read as the first version
// reads it.

#if QK % 16 == 0 && HID % 8 == 0
#define KT2 32

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

__device__ __forceinline__ void ldsm_x4_trans(unsigned addr, unsigned* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most `pending` of this thread's committed copy groups are in flight.
__device__ __forceinline__ void cp_async_wait(int pending) {
    if (pending == 0) {
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    } else {
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    }
}

extern "C" __global__ void __launch_bounds__(128)
hstu_attn_bf16_v2(const unsigned short* uvqk16, int w, const int* seq, const float* norms,
                  const int* tiles, int heads, float alpha, int chunk, float* out) {
    __shared__ __align__(16) unsigned short ks[2][KT2 * KS];
    __shared__ __align__(16) unsigned short vs[2][KT2 * VS];
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
    int br[4];
    key_ranges(t0, min(t0 + 63, len - 1), m, KT2, c0, c1, &br[0], &br[1], &br[2], &br[3]);
    // The block's steps: those of the first range, then those of the second.
    const int n0 = br[1] > br[0] ? (br[1] - br[0] + KT2 - 1) / KT2 : 0;
    const int n1 = br[3] > br[2] ? (br[3] - br[2] + KT2 - 1) / KT2 : 0;
    const int steps = n0 + n1;
    if (steps == 0) {
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

    // Step `st`'s k and v rows to buffer `b`, one commit group; every thread copies its share.
    // Rows past the sequence are other users' or the zeroed pad rows: finite, and masked.
    auto load = [&](int st, int b) {
        const int j0 = st < n0 ? br[0] + st * KT2 : br[2] + (st - n0) * KT2;
        for (int e = threadIdx.x; e < KT2 * (QK / 8); e += 128) {
            const int r = e / (QK / 8);
            const int c = (e % (QK / 8)) * 8;
            cp_async16(smem_u32(&ks[b][r * KS + c]), uvqk16 + (i64)(start + j0 + r) * w + kcol + c);
        }
        for (int e = threadIdx.x; e < KT2 * (HID / 8); e += 128) {
            const int r = e / (HID / 8);
            const int c = (e % (HID / 8)) * 8;
            cp_async16(smem_u32(&vs[b][r * VS + c]), uvqk16 + (i64)(start + j0 + r) * w + vcol + c);
        }
        cp_async_commit();
    };
    load(0, 0);

    unsigned qa[QK / 16][4];
    q_frags(uvqk16 + (i64)(start + (active ? r0 : t0) + g) * w + qcol, w, t, qa);
    float o[HID / 8][4];
#pragma unroll
    for (int nb = 0; nb < HID / 8; nb++) {
        o[nb][0] = o[nb][1] = o[nb][2] = o[nb][3] = 0.0f;
    }
    const int ilo = r0 + g;
    const int ihi = ilo + 8;
    // This lane's row within a k piece (ldmatrix.x4: 8 keys, 4 column blocks of 8) and within
    // a v piece (ldmatrix.x4.trans: keys 0..8 and 8..16, 2 column blocks of 8).
    const int k_row = lane & 7;
    const int k_col = (lane >> 3) * 8;
    const int v_row = (lane & 7) + ((lane >> 3) & 1) * 8;
    const int v_col = (lane >> 4) * 8;

    for (int st = 0; st < steps; st++) {
        const int b = st & 1;
        if (st + 1 < steps) {
            load(st + 1, b ^ 1);  // buffer b ^ 1 was released by the barrier ending step st - 1
            cp_async_wait(1);
        } else {
            cp_async_wait(0);
        }
        __syncthreads();  // step st's rows are in buffer b, from every thread's copies
        const int j0 = st < n0 ? br[0] + st * KT2 : br[2] + (st - n0) * KT2;
        if (active) {
#pragma unroll
            for (int p16 = 0; p16 < KT2; p16 += 16) {
                const int j = j0 + p16;
                const bool need =
                    (j < wr[1] && j + 16 > wr[0]) || (j < wr[3] && j + 16 > wr[2]);
                if (!need) {
                    continue;
                }
                float sc[2][4];
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    sc[half][0] = sc[half][1] = sc[half][2] = sc[half][3] = 0.0f;
                    const unsigned short* kr = &ks[b][(p16 + half * 8 + k_row) * KS + k_col];
#pragma unroll
                    for (int kk = 0; kk < QK / 32; kk++) {
                        unsigned f[4];
                        ldsm_x4(smem_u32(kr + kk * 32), f);
                        mma_bf16(sc[half], qa[2 * kk][0], qa[2 * kk][1], qa[2 * kk][2],
                                 qa[2 * kk][3], f[0], f[1]);
                        mma_bf16(sc[half], qa[2 * kk + 1][0], qa[2 * kk + 1][1],
                                 qa[2 * kk + 1][2], qa[2 * kk + 1][3], f[2], f[3]);
                    }
#if QK % 32 == 16
                    {
                        const unsigned short* kq = &ks[b][(p16 + half * 8 + g) * KS];
                        const int c = (QK - 16) + 2 * t;
                        mma_bf16(sc[half], qa[QK / 16 - 1][0], qa[QK / 16 - 1][1],
                                 qa[QK / 16 - 1][2], qa[QK / 16 - 1][3], ld2(kq + c),
                                 ld2(kq + c + 8));
                    }
#endif
                }
                unsigned pa[4];
                p_frag(sc, j, t, ilo, ihi, m, len, alpha, inv, pa);
                const unsigned short* vr = &vs[b][(p16 + v_row) * VS + v_col];
#pragma unroll
                for (int nb = 0; nb < HID / 16; nb++) {
                    unsigned f[4];
                    ldsm_x4_trans(smem_u32(vr + nb * 16), f);
                    mma_bf16(o[2 * nb], pa[0], pa[1], pa[2], pa[3], f[0], f[1]);
                    mma_bf16(o[2 * nb + 1], pa[0], pa[1], pa[2], pa[3], f[2], f[3]);
                }
#if HID % 16 == 8
                pv_block(o[HID / 8 - 1], pa, &vs[b][p16 * VS], g, t, HID - 8);
#endif
            }
        }
        __syncthreads();  // every warp is done with buffer b before step st + 2 copies into it
    }
    if (!active) {
        return;
    }
    add_out(o, out, start, ilo, ihi, r1, heads, h, t);
}
#endif
