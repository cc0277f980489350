//! Whose keys `EMBER.POOL` reads: the calling client's ACL user must be allowed to read every
//! key a call names, or the call is refused whole.
//!
//! The command declares no key (a call names blocks of many slots), so Redis itself checks only
//! that the caller may run `EMBER.POOL`. Without more, a user allowed the command could read any
//! string on the node as sums of rows. So the module checks each key itself, with the module
//! API's ACL check (`RedisModule_ACLCheckKeyPermissions`, Redis 7.0 and later), for read access
//! (`%R~` or `~` patterns), before any key is opened:
//!
//! - every key a call reads is its prefix followed by a block number
//!   ([`ember_pool_command::PoolCall::block_key`]), so it starts with the table's prefix by
//!   construction; the ACL check is what holds a user to its own keys (a reader allowed
//!   `%R~ember:dlrm:*` can pool `ember:dlrm:...` blocks and nothing else);
//! - a key the user may not read is an error reply naming the user and the key
//!   ([`refused`]), and the call reads nothing: never a partial result. The refusal is also
//!   written to the node's `ACL LOG`, as Redis's own refusals are;
//! - the user is found by the calling client's id (`RedisModule_GetClientUserNameById`). A client
//!   with no user of its own (a call through another module's `RedisModule_Call`, which runs as
//!   Redis's root) is refused ([`NO_USER`]): `RedisModule_GetCurrentUserName` would read a null
//!   user there. Scripts cannot call the command at all (it is flagged `deny-script`).
//!
//! Cost: one lookup of the user per call, then one check per block the call names (each block is
//! named once per call, so once per distinct key). For a user with every key (`~*`, the
//! `default` user) Redis answers the check from a flag; otherwise it matches the user's key
//! patterns (a glob match each).
//!
//! Redis's rule for a user with several selectors: a key passes if any selector allows reading
//! it, whether or not that selector allows `EMBER.POOL` (the module API checks keys per user, not
//! per selector). Ember's roles use one selector.

use ember_pool_command::COMMAND;

/// The refusal of a call whose client has no ACL user the module can check its keys against.
pub const NO_USER: &str = "NOPERM EMBER.POOL: the calling client has no ACL user to check its keys \
against (a call from another module?)";

/// The refusal of key `key` to user `user`: `NOPERM EMBER.POOL: user 'U' may not read key 'K'`.
/// `NOPERM` is Redis's own code for an ACL refusal, so a client reads it as one (Ember's client
/// then reads the rows with `GETRANGE`, which Redis refuses in turn, and the batch fails naming
/// the store).
pub fn refused(user: &[u8], key: &[u8]) -> String {
    format!(
        "NOPERM {COMMAND}: user '{}' may not read key '{}'",
        String::from_utf8_lossy(user),
        String::from_utf8_lossy(key)
    )
}

/// What the module needs of Redis's API, found at load time: `None` where Redis has all of it,
/// else the missing functions' names.
#[cfg(not(test))]
pub fn missing_api() -> Option<String> {
    use redis_module::raw;
    // By value: a copy of the pointer, not a reference to the static.
    fn there<T>(f: Option<T>) -> bool {
        f.is_some()
    }
    // SAFETY: the API's function pointers are written once by `RedisModule_Init` (the module's
    // load, before this runs) and only read afterwards, on Redis's main thread; each is copied
    // out (an `Option` of a function pointer), never referenced.
    let present = unsafe {
        [
            ("GetClientId", there(raw::RedisModule_GetClientId)),
            (
                "GetClientUserNameById",
                there(raw::RedisModule_GetClientUserNameById),
            ),
            (
                "GetModuleUserFromUserName",
                there(raw::RedisModule_GetModuleUserFromUserName),
            ),
            (
                "ACLCheckKeyPermissions",
                there(raw::RedisModule_ACLCheckKeyPermissions),
            ),
            ("ACLAddLogEntry", there(raw::RedisModule_ACLAddLogEntry)),
            ("FreeModuleUser", there(raw::RedisModule_FreeModuleUser)),
            ("FreeString", there(raw::RedisModule_FreeString)),
        ]
    };
    let missing: Vec<&str> = present
        .iter()
        .filter(|(_, there)| !there)
        .map(|(name, _)| *name)
        .collect();
    (!missing.is_empty()).then(|| missing.join(", "))
}

/// The ACL user of the client running the current command, held for the command's duration.
#[cfg(not(test))]
pub struct Caller {
    /// The user's handle (Redis's own user, not a copy): valid while the command runs, since
    /// Redis runs one command at a time and a user is only deleted by a command.
    user: *mut redis_module::raw::RedisModuleUser,
    /// The user's name (for refusals).
    name: redis_module::RedisString,
}

#[cfg(not(test))]
impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("name", &String::from_utf8_lossy(self.name.as_slice()))
            .finish()
    }
}

#[cfg(not(test))]
impl Caller {
    /// The user of the client running the command in `ctx`; a refusal ([`NO_USER`]) where the
    /// client has none (a call through another module) or its user is gone.
    pub fn of(ctx: &redis_module::Context) -> Result<Caller, redis_module::RedisError> {
        use redis_module::{RedisError, RedisString, raw};
        let no_user = || RedisError::Str(NO_USER);
        // SAFETY: `ctx` is the live context of the command being run (Redis's main thread); the
        // functions were checked present at load (`missing_api`). The client id of a context
        // without a client is 0, which no client has, so the lookup below finds none.
        let id = unsafe { raw::RedisModule_GetClientId.unwrap()(ctx.ctx) };
        // SAFETY: as above. The name returned is a new string owned by the caller (not under
        // automatic memory: the module never enables it), or null when no linked client has
        // that id or its client has no user (Redis's root).
        let name = unsafe { raw::RedisModule_GetClientUserNameById.unwrap()(ctx.ctx, id) };
        if name.is_null() {
            return Err(no_user());
        }
        // Owned from here: freed with `RedisModule_FreeString` when dropped.
        let name = RedisString::from_redis_module_string(ctx.ctx, name);
        // SAFETY: `name.inner` is the valid string just returned. The handle returned wraps
        // Redis's own user (not freed with the handle) or is null for a user that is gone.
        let user = unsafe { raw::RedisModule_GetModuleUserFromUserName.unwrap()(name.inner) };
        if user.is_null() {
            return Err(no_user());
        }
        Ok(Caller { user, name })
    }

    /// `Ok` if the user may read `key`; else the refusal naming the user and the key, also
    /// written to the node's `ACL LOG`.
    pub fn check_read(
        &self,
        ctx: &redis_module::Context,
        key: &redis_module::RedisString,
    ) -> Result<(), redis_module::RedisError> {
        use redis_module::{RedisError, raw};
        let access = redis_module::AclPermissions::ACCESS.bits();
        // SAFETY: `self.user` is the live handle from `of` (the same command), `key.inner` a
        // valid string; the flags are one of the documented key flags. The call reads both and
        // keeps neither.
        let ok = unsafe {
            raw::RedisModule_ACLCheckKeyPermissions.unwrap()(self.user, key.inner, access)
        } == raw::REDISMODULE_OK as std::os::raw::c_int;
        if ok {
            return Ok(());
        }
        // SAFETY: as above, with the command's own context (whose client is the one refused);
        // the log entry copies the key.
        unsafe {
            raw::RedisModule_ACLAddLogEntry.unwrap()(
                ctx.ctx,
                self.user,
                key.inner,
                raw::RedisModuleACLLogEntryReason_REDISMODULE_ACL_LOG_KEY,
            );
        }
        Err(RedisError::String(refused(
            self.name.as_slice(),
            key.as_slice(),
        )))
    }
}

#[cfg(not(test))]
impl Drop for Caller {
    fn drop(&mut self) {
        // SAFETY: `self.user` came from `RedisModule_GetModuleUserFromUserName` and is freed
        // once, here; freeing it releases the handle only, not Redis's user.
        unsafe {
            redis_module::raw::RedisModule_FreeModuleUser.unwrap()(self.user);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_user_and_the_key_with_redis_acl_code() {
        let e = refused(b"reader", b"ember:other:v1:t:7");
        assert_eq!(
            e,
            "NOPERM EMBER.POOL: user 'reader' may not read key 'ember:other:v1:t:7'"
        );
        // Redis's own ACL code: a client treats it as a refusal of the command by the node,
        // never as one of the module's own codes.
        assert!(ember_pool_command::not_run_by_the_node(
            e.split(' ').next().unwrap()
        ));
        assert!(NO_USER.starts_with("NOPERM EMBER.POOL: "));
        // Bytes that are not UTF-8 are shown, not dropped.
        assert!(refused(b"u", b"k\xff").contains("'k\u{fffd}'"));
    }
}
