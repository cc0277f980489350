// Ember's batch deduplication on the GPU (NVRTC). Keys are (feature, id) pairs; each feature's
// distinct ids get dense numbers 0..U_f, every position gets its id's number (the inverse), and
// the distinct rows are copied once into a compact buffer that the pooling kernel then reads
// through the inverse instead of the table.
//
// 1. ember_dedup_insert: each position inserts its key into an open-addressing table (linear
//    probing, atomicCAS) and remembers its slot.
// 2. ember_dedup_number: each occupied slot takes the next number of its feature (atomicAdd) and
//    records its id at that number.
// 3. ember_dedup_inverse: each position reads its slot's number.
// 4. ember_dedup_gather: one warp copies each distinct row into the compact buffer.

typedef unsigned char u8;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define EMPTY 0xffffffffffffffffull

// Must match `FeatDesc::words` in src/embed/tables.rs and kernels/pool.cu (56 bytes).
struct FeatDesc {
    const u8* hot;
    const u8* cold;
    const int* remap;
    i64 rows;
    i64 hot_rows;
    int stride;
    int dim;
    int out_col;
    int kj_feature;
};

__device__ __forceinline__ u64 mix64(u64 k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

// The f with bounds[f] <= j < bounds[f + 1] (bounds has n + 1 entries, non-decreasing); empty
// ranges are skipped because the search keeps the last f with bounds[f] <= j.
__device__ __forceinline__ int range_of(const i64* bounds, int n, i64 j) {
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (bounds[mid] <= j) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

template <typename I>
__device__ __forceinline__ void insert(const i64* feat_start, int n_feat, const I* ids, i64 n,
                                       u64* keys, u64 mask, u32* slot_of) {
    const i64 j = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) {
        return;
    }
    const int f = range_of(feat_start, n_feat, j);
    const u64 key = ((u64)f << 40) | (u64)ids[j];
    u64 h = mix64(key) & mask;
    while (true) {
        const u64 prev = atomicCAS(keys + h, EMPTY, key);
        if (prev == EMPTY || prev == key) {
            slot_of[j] = (u32)h;
            return;
        }
        h = (h + 1) & mask;
    }
}

extern "C" __global__ void ember_dedup_insert64(const i64* feat_start, int n_feat, const i64* ids,
                                                i64 n, u64* keys, u64 mask, u32* slot_of) {
    insert(feat_start, n_feat, ids, n, keys, mask, slot_of);
}

extern "C" __global__ void ember_dedup_insert32(const i64* feat_start, int n_feat, const u32* ids,
                                                i64 n, u64* keys, u64 mask, u32* slot_of) {
    insert(feat_start, n_feat, ids, n, keys, mask, slot_of);
}

// uniq[feat_start[f] + u] = the id numbered u in feature f (a feature has at most as many
// distinct ids as positions, so the positions' layout holds them).
extern "C" __global__ void ember_dedup_number(const u64* keys, u64 cap, const i64* feat_start,
                                              u32* counts, u32* number, i64* uniq) {
    const u64 h = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= cap) {
        return;
    }
    const u64 key = keys[h];
    if (key == EMPTY) {
        return;
    }
    const int f = (int)(key >> 40);
    const u32 u = atomicAdd(counts + f, 1u);
    number[h] = u;
    uniq[feat_start[f] + u] = (i64)(key & ((1ull << 40) - 1));
}

extern "C" __global__ void ember_dedup_inverse(const u32* slot_of, const u32* number, i64 n,
                                               u32* inverse) {
    const i64 j = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (j < n) {
        inverse[j] = number[slot_of[j]];
    }
}

__device__ __forceinline__ const u8* row_ptr(const FeatDesc& d, i64 id) {
    if (d.remap != nullptr) {
        id = __ldg(d.remap + id);
    }
    if (id < d.hot_rows) {
        return d.hot + id * d.stride;
    }
    return d.cold + (id - d.hot_rows) * d.stride;
}

// One warp per compact slot: slot s of feature f (cap_start[f] <= s < cap_start[f + 1]) holds
// distinct id number s - cap_start[f] when that number exists. `compact[f]` is the feature's
// compact base (256-byte aligned).
extern "C" __global__ void ember_dedup_gather(const FeatDesc* feats, int n_feat,
                                              const i64* cap_start, const i64* feat_start,
                                              const u32* counts, const i64* uniq,
                                              u8* const* compact) {
    const i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (warp >= cap_start[n_feat]) {
        return;
    }
    const int f = range_of(cap_start, n_feat, warp);
    const i64 u = warp - cap_start[f];
    if (u >= (i64)counts[f]) {
        return;
    }
    const FeatDesc d = feats[f];
    const u8* src = row_ptr(d, uniq[feat_start[f] + u]);
    u8* dst = compact[f] + u * d.stride;
    if ((d.stride & 3) == 0 && (((u64)src) & 3) == 0) {
        for (int w = lane; w < d.stride / 4; w += 32) {
            ((u32*)dst)[w] = __ldg((const u32*)src + w);
        }
    } else {
        for (int k = lane; k < d.stride; k += 32) {
            dst[k] = __ldg(src + k);
        }
    }
}
