//! What Ember sends and reads: [`Cmd`], a command built argument by argument and packed as RESP;
//! [`Value`], a reply (RESP2), with a server's error reply as [`ServerError`] (its code, the first
//! word, and the rest). Ember's own types: no type of the `redis` crate crosses this crate's
//! boundary (the crate parses nothing here; its parser is the property tests' reference).

use std::fmt;

/// A reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A nil bulk string or array.
    Nil,
    Int(i64),
    BulkString(Vec<u8>),
    Array(Vec<Value>),
    /// A status reply other than `+OK`.
    SimpleString(String),
    /// `+OK`.
    Okay,
    ServerError(ServerError),
}

impl Value {
    /// The reply as text: a bulk string (UTF-8, lossily) or a status; `None` for anything else.
    pub fn text(&self) -> Option<String> {
        match self {
            Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Value::SimpleString(s) => Some(s.clone()),
            Value::Okay => Some("OK".into()),
            _ => None,
        }
    }

    /// Appends the reply as RESP2 bytes, as a server sends it. The reference writer of the
    /// reader's tests and of the fuzz checks (`fuzz/`), not an API.
    #[doc(hidden)]
    pub fn write_resp(&self, out: &mut Vec<u8>) {
        match self {
            Value::Okay => out.extend_from_slice(b"+OK\r\n"),
            Value::SimpleString(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
            Value::Int(i) => out.extend_from_slice(format!(":{i}\r\n").as_bytes()),
            Value::Nil => out.extend_from_slice(b"$-1\r\n"),
            Value::BulkString(b) => {
                out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Value::Array(items) => {
                out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                items.iter().for_each(|i| i.write_resp(out));
            }
            Value::ServerError(e) => out.extend_from_slice(format!("-{e}\r\n").as_bytes()),
        }
    }
}

/// An error reply: `-CODE detail`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    code: String,
    detail: Option<String>,
}

impl ServerError {
    /// Reads an error reply's line (without its `-` and its CRLF).
    pub fn parse(line: &[u8]) -> ServerError {
        let text = String::from_utf8_lossy(line);
        let (code, detail) = match text.split_once(' ') {
            Some((c, d)) => (c.to_string(), Some(d.to_string())),
            None => (text.into_owned(), None),
        };
        ServerError { code, detail }
    }

    /// The code: the first word (`ERR`, `MOVED`, `NOPERM`, a module's own).
    pub fn code(&self) -> &str {
        &self.code
    }

    /// What follows the code.
    pub fn details(&self) -> Option<&str> {
        self.detail.as_deref()
    }

    /// Whether the cluster answered that the key lives elsewhere or cannot be served for now (a
    /// redirect, a node down or loading): what a call retries.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.code(),
            "MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN" | "LOADING" | "MASTERDOWN"
        )
    }
}

/// The reply as the server wrote it: `CODE detail`.
impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.code)?;
        if let Some(d) = &self.detail {
            write!(f, " {d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ServerError {}

/// A command: its name, then its arguments, each a byte string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cmd {
    args: Vec<Vec<u8>>,
}

/// The command `name`, to which arguments are added with [`Cmd::arg`].
pub fn cmd(name: &str) -> Cmd {
    Cmd {
        args: vec![name.as_bytes().to_vec()],
    }
}

impl Cmd {
    /// Adds an argument (a string, bytes or a number, written in decimal).
    pub fn arg(&mut self, a: impl Arg) -> &mut Cmd {
        let mut buf = Vec::new();
        a.write(&mut buf);
        self.args.push(buf);
        self
    }

    /// The name and the arguments.
    pub fn args(&self) -> impl ExactSizeIterator<Item = &[u8]> {
        self.args.iter().map(Vec::as_slice)
    }

    /// The command as RESP: an array of bulk strings.
    pub fn packed(&self) -> Vec<u8> {
        let mut out = Vec::new();
        pack_into(&mut out, self.args());
        out
    }
}

/// Appends the RESP array of bulk strings `args` to `out`.
pub fn pack_into<'a>(out: &mut Vec<u8>, args: impl ExactSizeIterator<Item = &'a [u8]>) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// What can be a command's argument.
pub trait Arg {
    /// Writes the argument's bytes.
    fn write(&self, out: &mut Vec<u8>);
}

impl<T: Arg + ?Sized> Arg for &T {
    fn write(&self, out: &mut Vec<u8>) {
        (**self).write(out)
    }
}

impl Arg for str {
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes())
    }
}

impl Arg for String {
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes())
    }
}

impl Arg for [u8] {
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self)
    }
}

impl Arg for Vec<u8> {
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self)
    }
}

impl<const N: usize> Arg for [u8; N] {
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self)
    }
}

macro_rules! decimal_args {
    ($($t:ty),*) => {$(
        impl Arg for $t {
            fn write(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(self.to_string().as_bytes())
            }
        }
    )*};
}
decimal_args!(u8, u16, u32, u64, usize, i32, i64, isize);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A command is packed byte for byte as the `redis` crate packs it, whatever its
        /// arguments hold (CR, LF, nothing) and whatever numbers they are.
        #[test]
        fn commands_are_packed_as_the_crate_packs_them(
            name in "[A-Z.]{1,12}",
            bytes in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..6),
            n in any::<u64>(),
            i in any::<i64>(),
        ) {
            let mut ours = cmd(&name);
            let mut theirs = redis::cmd(&name);
            for b in &bytes {
                ours.arg(b.as_slice());
                theirs.arg(b.as_slice());
            }
            ours.arg(n).arg(i).arg("text");
            theirs.arg(n).arg(i).arg("text");
            prop_assert_eq!(ours.packed(), theirs.get_packed_command());
        }
    }

    #[test]
    fn an_error_reply_is_its_code_and_its_detail() {
        let e = ServerError::parse(b"EMBERBLOCK ember:m:v1:t:0 holds 3 bytes, not 9");
        assert_eq!(e.code(), "EMBERBLOCK");
        assert_eq!(e.details(), Some("ember:m:v1:t:0 holds 3 bytes, not 9"));
        assert!(!e.is_transient());
        let bare = ServerError::parse(b"NOPERM");
        assert_eq!((bare.code(), bare.details()), ("NOPERM", None));
        assert_eq!(bare.to_string(), "NOPERM");
        assert!(ServerError::parse(b"TRYAGAIN Multiple keys").is_transient());
    }
}
