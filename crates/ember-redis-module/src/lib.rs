//! The Ember Redis module: `EMBER.POOL`, pooling embedding rows on the node that stores them.
//!
//! Load it into every node of the cluster that holds a model's tables:
//!
//! ```text
//! redis-server --cluster-enabled yes --loadmodule target/release/libember_redis_module.so
//! ```
//!
//! The command, its arguments, its reply and its errors are defined once, in
//! the `ember-pool-command` crate (the client's side encodes with the same code). This
//! file is the glue: each block key of a call opened once and read in place (no copy), the
//! bags summed by `pooled::sum_bags` into one buffer reused from call to call, the sums
//! answered as one bulk string. The command reads only: it is flagged `readonly`, declares no
//! key (a call names blocks of many slots, all on this node) and so runs on replicas as on
//! primaries, and changes nothing. It is flagged `deny-script` too: scripts cannot call it.
//!
//! Access: Redis checks that the caller may run `EMBER.POOL`; the module checks that the
//! caller's ACL user may read every key the call names before it opens any (`acl.rs`), and
//! refuses the whole call with `NOPERM` naming the user and the first key it may not read.
//!
//! Failure: a malformed call, a missing or short block, a key of another type is an error
//! reply naming it, never a crash (a panic in the summing is caught and answered as an error).
//! The module refuses to load into a Redis without the module API's ACL checks (before 7.0).

use ember_pool_command::{self as pooled, PoolCall, Refusal, RefusalCode};
use std::cell::RefCell;

pub mod acl;

#[cfg(not(test))]
use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue, redis_module};

thread_local! {
    /// The reply and the decoded rows of the last call, reused (Redis runs commands on its
    /// main thread): nothing is allocated per row, and per call only when a reply outgrows the
    /// last one.
    static BUFFERS: RefCell<(Vec<u8>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Runs a parsed call over `blocks` (read in place by the caller) with the thread's buffers,
/// handing the reply's bytes to `reply`. A panic (a bug: every bound is checked first) is
/// answered as an error rather than taking the server down.
pub fn run<R>(
    call: &PoolCall<'_>,
    blocks: &[Option<&[u8]>],
    reply: impl FnOnce(&[u8]) -> R,
) -> Result<R, Refusal> {
    BUFFERS.with(|b| {
        let mut b = b.borrow_mut();
        let (out, scratch) = &mut *b;
        let summed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pooled::sum_bags(call, blocks, out, scratch)
        }));
        match summed {
            Ok(Ok(())) => {
                let r = reply(out);
                // Keep at most 16 MiB between calls.
                if out.capacity() > 16 << 20 {
                    *out = Vec::new();
                }
                Ok(r)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Refusal::new(
                RefusalCode::Bug,
                format!("{}: internal error (a bug)", pooled::COMMAND),
            )),
        }
    })
}

#[cfg(not(test))]
fn ember_pool(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    use redis_module::KeyType;
    let raw: Vec<&[u8]> = args.iter().skip(1).map(|a| a.as_slice()).collect();
    let call = PoolCall::parse(&raw).map_err(reply_error)?;
    let caller = acl::Caller::of(ctx)?;
    // Each block's key (the call's prefix and the block's number) checked against the caller's
    // ACL user, then opened once and held open while its bytes are read in place. A key the
    // user may not read refuses the call before anything is summed.
    let mut key = Vec::new();
    let mut keys = Vec::with_capacity(call.n_blocks());
    for i in 0..call.n_blocks() {
        call.block_key(i, &mut key);
        let name = ctx.create_string(key.as_slice());
        caller.check_read(ctx, &name)?;
        keys.push(ctx.open_key(&name));
    }
    drop(caller);
    let mut blocks: Vec<Option<&[u8]>> = Vec::with_capacity(keys.len());
    for (i, k) in keys.iter().enumerate() {
        match k.key_type() {
            KeyType::Empty => blocks.push(None),
            KeyType::String => blocks.push(k.read()?),
            _ => {
                call.block_key(i, &mut key);
                return Err(reply_error(Refusal::new(
                    RefusalCode::WrongType,
                    format!(
                        "{} is not a string: not a block of rows",
                        String::from_utf8_lossy(&key)
                    ),
                )));
            }
        }
    }
    run(&call, &blocks, |bytes| {
        // The reply written straight from the reused buffer (Redis copies it into the client's
        // output buffer); `NoReply` tells the crate it was answered.
        redis_module::raw::reply_with_string_buffer(ctx.ctx, bytes.as_ptr().cast(), bytes.len());
        RedisValue::NoReply
    })
    .map_err(reply_error)
}

/// `r` as the error reply (its code first).
#[cfg(not(test))]
fn reply_error(r: Refusal) -> RedisError {
    RedisError::String(r.to_string())
}

/// At load: refuses a Redis whose module API lacks what the key checks need (before 7.0),
/// rather than running the command unchecked.
#[cfg(not(test))]
fn init(ctx: &Context, _args: &[RedisString]) -> redis_module::Status {
    match acl::missing_api() {
        None => redis_module::Status::Ok,
        Some(missing) => {
            ctx.log_warning(&format!(
                "{} needs Redis 7.0 or later: this server's module API lacks {missing}",
                pooled::COMMAND
            ));
            redis_module::Status::Err
        }
    }
}

#[cfg(not(test))]
redis_module! {
    name: "ember",
    version: 1,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [],
    init: init,
    commands: [
        [pooled::COMMAND, ember_pool, "readonly deny-script", 0, 0, 0, ""],
    ],
}
