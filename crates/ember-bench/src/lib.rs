//! Ember's benchmarks, the code behind `ember bench ...`: each one sets up its workload,
//! measures Ember against its peer in the same run (the memory ceiling, the same tables in DRAM,
//! a plain mmap, the disk, PyTorch through the scripts in `bench/`), returns a report value, and
//! prints it as text or JSON.
//!
//! - [`ceiling`]: the memory ceiling, the simplest gather-and-sum over the same rows and ids;
//! - [`dense_peak`]: the dense ceiling, this CPU's dot-product peak (AMX tiles, AVX-512) measured
//!   by back-to-back instructions on registers;
//! - [`workload`]: id streams (uniform, Zipf, replayed traces);
//! - [`disk`]: the disk's random-read rate, cold page caches;
//! - [`redis_cluster`]: a real Redis Cluster on loopback, started and torn down by the caller;
//! - [`stats`]: medians and byte sizes for reports.
//!
//! Like the binary it serves, this crate reports errors with `anyhow`: every error ends as a
//! message to the person who ran the benchmark.

pub mod ceiling;
pub mod dense_peak;
pub mod disk;
pub mod redis_cluster;
pub mod stats;
pub mod workload;
