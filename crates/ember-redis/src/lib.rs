//! A Redis Cluster client built for serving: every call has a deadline, retries are bounded and
//! fit inside it, and a call's commands go to their nodes as one pipeline per node, all sent
//! before any reply is read. It knows Redis only (no table, row or model): Ember's remote tier
//! (`ember-tier`'s `storage/remote/`) and its model registry (`ember-registry`) are built on it.
//!
//! | file | what |
//! |---|---|
//! | `slot.rs` | the cluster's key slot (CRC-16) |
//! | `options.rs` | [`ClusterOptions`] (the `redis://` URL, timeouts, retries) |
//! | `error.rs` | how calls fail: [`FailKind`], [`Failure`], [`RedisError`] |
//! | `ops.rs` | [`Ops`]: a call's commands, packed |
//! | `resp.rs` | [`Conn`]: a node's connection (RESP2, parsed in place, bounded by a deadline); [`Replies`] |
//! | `tls.rs` | [`RedisTls`]: `rediss://`, rustls over a node's connection |
//! | `wire.rs` | a node's state and counters; `CLUSTER SLOTS` read into ranges |
//! | `cluster.rs` | [`Cluster`]: routing, one pipeline per node, deadlines, bounded retries, failover |
//! | `value.rs` | [`Cmd`] (a command, packed as RESP) and [`Value`] (a reply; [`ServerError`] an error reply's code and detail): Ember's own, no `redis` crate type crosses this crate's boundary |
//! | `commands.rs` | [`call`], [`hash_entries`]: single commands for administration |

pub mod acl;
mod cluster;
mod commands;
mod error;
pub mod ops;
mod options;
mod resp;
pub mod slot;
mod tls;
mod value;
mod wire;

pub use cluster::Cluster;
pub use commands::{bad_reply, call, hash_entries, query_node};
pub use error::{FailKind, Failure, RedisError, Result};
pub use ops::Ops;
pub use options::{ClusterOptions, SETUP_TIMEOUT};
pub use resp::{Conn, Replies, Reply, WireError};
pub use tls::RedisTls;
pub use value::{Arg, Cmd, ServerError, Value, cmd, pack_into};
pub use wire::NodeStats;
