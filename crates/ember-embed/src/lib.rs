//! Ember's embedding stage: tables (f32, f16, bf16, int8 / int4 row-wise), batches in
//! KeyedJaggedTensor layout, and the table-batched pooled lookup with SIMD kernels, software
//! prefetch, threads and batch deduplication.
//!
//! ```
//! use ember_embed::*;
//! let vals: Vec<f32> = (0..12).map(|i| i as f32).collect();
//! let table = EmbeddingTable::from_f32("t", 4, 3, DType::F32, &vals).unwrap();
//! let coll = EmbeddingCollection::one_feature_per_table(vec![table]).unwrap();
//! // batch of 2 samples: sample 0 looks up rows 0 and 3, sample 1 nothing.
//! let kj = KeyedJagged::from_lengths(vec!["t".into()], 2, &[2, 0], Ids::U32(vec![0, 3]), None).unwrap();
//! let batch = coll.check_view(&kj).unwrap();
//! let mut out = vec![0f32; 2 * 3];
//! pooled_lookup(&coll, batch, Pooling::Sum, &mut out).unwrap();
//! assert_eq!(out, [9.0, 11.0, 13.0, 0.0, 0.0, 0.0]);
//! ```

pub mod alloc;
mod checked;
mod collection;
pub mod dedup;
mod dtype;
mod error;
pub mod files;
mod fpmode;
mod isa;
mod jagged;
pub mod pool;
pub mod prefetch;
mod quant;
pub mod rowfile;
pub mod shard;
pub mod staged;
mod table;

pub mod trace;

pub use alloc::PagePolicy;
pub use checked::{CheckedBatch, CheckedSamples, Lengths, MergeBuffers, Pieces};
pub use collection::{
    CheckedView, CollectionId, EmbeddingCollection, Feature, PARALLEL_CHECK_IDS, id_checks,
};
pub use dtype::DType;
pub use error::{Cause, EmbedError, Result};
pub use fpmode::FlushDenormals;
pub use isa::Isa;
pub use jagged::{Ids, KeyedJagged, RowIndex};
pub use pool::{
    Dedup, PREFETCH_CANDIDATES, PoolOptions, PoolStats, Pooler, Pooling, Prefetch, pooled_lookup,
};
pub use prefetch::PrefetchLevel;
pub use shard::{Shard, ShardedEmbeddings};
pub use staged::StagedBatch;
pub use table::{EmbeddingTable, Placement, RowsRef, UpdateLog};
