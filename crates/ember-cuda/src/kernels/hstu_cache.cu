// The HSTU pass with a cache of users' histories (crates/ember-cuda/src/hstu/cached.rs),
// compiled after hstu.cu (i64). A cached pass computes only some tokens (their rows compact:
// row k is token rows[k]); the projections and attention keep the whole batch's token layout,
// where the held tokens' keys and values are put from the cache's segments.
//
// A segment's values, as the CPU's cache holds them (crates/ember-model/src/hstu/entry.rs):
// [layers][tokens][v (heads x HID) | k (heads x QK)]. A projections row (uvqk, f32):
// [u (heads x HID) | v (heads x HID) | q (heads x QK) | k (heads x QK)].

// dst[rows[k]] = src[k], rows of w values, k < n. (The compact projections into the batch's
// layout.)
extern "C" __global__ void hstu_scatter(const float* src, int w, const int* rows, int n,
                                        float* dst) {
    const i64 total = (i64)n * w;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (i64)gridDim.x * blockDim.x) {
        const i64 k = e / w;
        const int c = (int)(e - k * w);
        dst[(i64)rows[k] * w + c] = src[e];
    }
}

// Between segments and the projections, for layer `layer`: piece p is segs[p]'s values
// ([layers][n][kv], kv = heads x (HID + QK)) for the n = meta[2p] tokens from row
// meta[2p + 1] of uvqk ([_, w]) on. to_uvqk 1: the segment's v and k into uvqk's v and k
// columns (held tokens); 0: uvqk's into the segment (kept tokens). Grid (pieces, any).
extern "C" __global__ void hstu_kv(const unsigned long long* segs, const int* meta, int layer,
                                   int heads, float* uvqk, int w, int to_uvqk) {
    const int p = blockIdx.x;
    const int n = meta[2 * p];
    const int row = meta[2 * p + 1];
    const int vw = heads * HID;
    const int kv = heads * (HID + QK);
    const int kcol = 2 * heads * HID + heads * QK;
    float* seg = reinterpret_cast<float*>(segs[p]) + (i64)layer * n * kv;
    const i64 total = (i64)n * kv;
    for (i64 e = (i64)blockIdx.y * blockDim.x + threadIdx.x; e < total;
         e += (i64)gridDim.y * blockDim.x) {
        const i64 tok = e / kv;
        const int c = (int)(e - tok * kv);
        float* u = uvqk + (i64)(row + tok) * w + (c < vw ? vw + c : kcol + (c - vw));
        if (to_uvqk) {
            *u = seg[e];
        } else {
            seg[e] = *u;
        }
    }
}
