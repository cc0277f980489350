//! [`Ops`]: a call's commands, packed (RESP) back to back in one buffer, each with the slot of
//! its key. `GETRANGE` and `SET` are packed by hand (the hot paths); anything else through the
//! `redis` crate's `Cmd`.

use crate::slot::key_slot;
use crate::value::{Cmd, pack_into};

/// Commands for [`Cluster::run`]: packed (RESP) commands back to back in one buffer, each with the
/// slot of its key.
#[derive(Debug, Default)]
pub struct Ops {
    buf: Vec<u8>,
    ops: Vec<(u16, u32, u32)>,
    /// Whether a server error the cluster cannot fix by retrying (not a redirect, not a node
    /// down) is the command's reply rather than the call's failure ([`Ops::errors_as_replies`]).
    pass_errors: bool,
}

impl Ops {
    pub fn clear(&mut self) {
        self.buf.clear();
        self.ops.clear();
        self.pass_errors = false;
    }

    /// Makes each command's own server error (one the cluster cannot fix by retrying: not a
    /// redirect, not a node down or loading) its reply, handed over as `Reply::Other` with a
    /// `Value::ServerError`, instead of failing the whole call: for commands a caller can
    /// answer another way (a module's command that a node does not have).
    pub fn errors_as_replies(&mut self) {
        self.pass_errors = true;
    }

    pub(super) fn passes_errors(&self) -> bool {
        self.pass_errors
    }

    /// Adds a command of any arguments, binary-safe, routed by `slot` (for a command that
    /// declares no key: it goes to the node serving `slot`).
    pub fn command(&mut self, slot: u16, args: &[&[u8]]) {
        let s0 = self.buf.len() as u32;
        self.buf.push(b'*');
        self.buf
            .extend_from_slice(fmt_usize(&mut itoa_buf(), args.len()));
        self.buf.extend_from_slice(b"\r\n");
        for a in args {
            bulk(&mut self.buf, a);
        }
        self.ops.push((slot, s0, self.buf.len() as u32));
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// The slot of command `i`'s key.
    pub(super) fn slot(&self, i: usize) -> u16 {
        self.ops[i].0
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Adds a command on `key` (its slot routes it).
    pub fn push(&mut self, key: &[u8], cmd: &Cmd) {
        let start = self.buf.len() as u32;
        pack_into(&mut self.buf, cmd.args());
        self.ops.push((key_slot(key), start, self.buf.len() as u32));
    }

    /// Adds `GETRANGE key start end` (packed by hand, no formatting machinery: the hot path of
    /// remote reads).
    pub fn getrange(&mut self, key: &[u8], start: usize, end: usize) {
        let s0 = self.buf.len();
        getrange_head(key, &mut self.buf);
        self.getrange_tail(s0, key_slot(key), start, end);
    }

    /// Adds `GETRANGE key start end` whose head (`head`, from [`getrange_head`]) and key slot
    /// were computed once per key: a block's key is read by many rows.
    pub fn getrange_with_head(&mut self, head: &[u8], slot: u16, start: usize, end: usize) {
        let s0 = self.buf.len();
        self.buf.extend_from_slice(head);
        self.getrange_tail(s0, slot, start, end);
    }

    /// Ends the `GETRANGE` whose head starts at `s0`: its range, and the command's entry.
    fn getrange_tail(&mut self, s0: usize, slot: u16, start: usize, end: usize) {
        bulk(&mut self.buf, fmt_usize(&mut itoa_buf(), start));
        bulk(&mut self.buf, fmt_usize(&mut itoa_buf(), end));
        self.ops.push((slot, s0 as u32, self.buf.len() as u32));
    }

    /// Adds `SET key value` (packed by hand: values are large blocks, not copied twice).
    pub fn set(&mut self, key: &[u8], value: &[u8]) {
        let s0 = self.buf.len() as u32;
        self.buf.extend_from_slice(b"*3\r\n$3\r\nSET\r\n");
        bulk(&mut self.buf, key);
        bulk(&mut self.buf, value);
        self.ops.push((key_slot(key), s0, self.buf.len() as u32));
    }

    /// The packed bytes of command `i`.
    pub(super) fn bytes(&self, i: usize) -> &[u8] {
        let (_, s, e) = self.ops[i];
        &self.buf[s as usize..e as usize]
    }
}

/// Appends the head of `GETRANGE key ...` (the command and its key) to `out`.
pub fn getrange_head(key: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(b"*4\r\n$8\r\nGETRANGE\r\n");
    bulk(out, key);
}

/// `$<len>\r\n<bytes>\r\n`.
fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'$');
    out.extend_from_slice(fmt_usize(&mut itoa_buf(), bytes.len()));
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// A buffer for [`fmt_usize`].
pub fn itoa_buf() -> [u8; 20] {
    [0; 20]
}

/// `v` in decimal, written at the end of `buf`.
pub fn fmt_usize(buf: &mut [u8; 20], mut v: usize) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    &buf[i..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn getrange_is_packed_as_the_crate_packs_it() {
        let mut ops = Ops::default();
        ops.getrange(b"ember:m:v1:t:17", 0, 255);
        ops.getrange(b"k", 1_000_000, 1_000_071);
        ops.set(b"s", b"\x00\r\nv");
        let mut want = Vec::new();
        redis::cmd("GETRANGE")
            .arg("ember:m:v1:t:17")
            .arg(0)
            .arg(255)
            .write_packed_command(&mut want);
        redis::cmd("GETRANGE")
            .arg("k")
            .arg(1_000_000)
            .arg(1_000_071)
            .write_packed_command(&mut want);
        redis::cmd("SET")
            .arg("s")
            .arg(b"\x00\r\nv")
            .write_packed_command(&mut want);
        assert_eq!(ops.buf, want);
        // With the head packed once, the same bytes.
        let mut head = Vec::new();
        getrange_head(b"k", &mut head);
        let mut again = Ops::default();
        again.getrange_with_head(&head, key_slot(b"k"), 1_000_000, 1_000_071);
        assert_eq!(again.bytes(0), ops.bytes(1));
        assert_eq!(ops.ops[0].0, key_slot(b"ember:m:v1:t:17"));
        assert_eq!(ops.len(), 3);
        // Any command, binary-safe, routed by the slot given.
        let mut any = Ops::default();
        any.command(77, &[b"EMBER.POOL", b"p:", b"\x00\r\n\xff", b""]);
        let mut want = Vec::new();
        redis::cmd("EMBER.POOL")
            .arg("p:")
            .arg(b"\x00\r\n\xff")
            .arg(b"")
            .write_packed_command(&mut want);
        assert_eq!(any.bytes(0), want.as_slice());
        assert_eq!(any.slot(0), 77);
    }
}
