//! The RESP reader against the `redis` crate's parser (random replies, cut at every point), and
//! [`Conn`] over a real loopback socket fed in pieces, closed, or silent.

use super::*;
use proptest::prelude::*;
use std::net::TcpListener;
use std::thread;

/// The `redis` crate's value as Ember's (the reference's answer, to compare with).
fn from_crate(v: redis::Value) -> Value {
    match v {
        redis::Value::Nil => Value::Nil,
        redis::Value::Int(i) => Value::Int(i),
        redis::Value::BulkString(b) => Value::BulkString(b),
        redis::Value::Array(a) => Value::Array(a.into_iter().map(from_crate).collect()),
        redis::Value::SimpleString(s) => Value::SimpleString(s),
        redis::Value::Okay => Value::Okay,
        redis::Value::ServerError(e) => Value::ServerError(ServerError::parse(
            match e.details() {
                Some(d) => format!("{} {d}", e.code()),
                None => e.code().to_string(),
            }
            .as_bytes(),
        )),
        other => unreachable!("not RESP2: {other:?}"),
    }
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Okay),
        "[a-zA-Z0-9 ]{1,12}"
            .prop_filter("+OK is Okay", |s| s != "OK")
            .prop_map(Value::SimpleString),
        any::<i64>().prop_map(Value::Int),
        // Error replies: a code, with or without a detail (Redis's own codes and a module's).
        (
            "(ERR|MOVED|ASK|NOPERM|MISSING|[A-Z]{1,8})",
            proptest::option::of("[a-z0-9:. ]{1,20}")
        )
            .prop_map(|(c, d)| Value::ServerError(ServerError::parse(
                match d {
                    Some(d) => format!("{c} {d}"),
                    None => c,
                }
                .as_bytes(),
            ))),
        Just(Value::Nil),
        // Bytes that include CR and LF: a bulk string is read by length, not by line.
        proptest::collection::vec(prop_oneof![Just(b'\r'), Just(b'\n'), any::<u8>()], 0..300)
            .prop_map(Value::BulkString),
    ];
    leaf.prop_recursive(3, 40, 6, |inner| {
        proptest::collection::vec(inner, 0..6).prop_map(Value::Array)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Every prefix of a reply is incomplete; the whole reply decodes as the crate decodes it.
    #[test]
    fn replies_decode_as_the_crate_decodes_them(v in value(), tail in proptest::collection::vec(any::<u8>(), 0..8)) {
        let mut b = Vec::new();
        v.write_resp(&mut b);
        let n = b.len();
        for cut in 0..n {
            prop_assert!(matches!(complete(&b[..cut]).unwrap(), Need::More(_)), "cut at {cut}");
        }
        b.extend_from_slice(&tail);
        prop_assert_eq!(complete(&b).unwrap(), Need::Done(n));
        let (got, len) = decode(&b).unwrap();
        prop_assert_eq!(len, n);
        prop_assert_eq!(&got, &from_crate(redis::parse_redis_value(&b[..n]).unwrap()));
        prop_assert_eq!(got, v);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Fuzzing by property (issue 61): arbitrary bytes, and valid replies with bytes changed,
    /// never panic the reader; what `complete` calls whole, `decode` reads to the same length
    /// or refuses as a protocol error.
    #[test]
    fn any_bytes_are_read_or_refused_never_a_panic(
        v in value(),
        junk in proptest::collection::vec(any::<u8>(), 0..300),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        mutate in any::<bool>(),
    ) {
        let b = if mutate {
            let mut b = Vec::new();
            v.write_resp(&mut b);
            for &(at, byte) in &edits {
                if !b.is_empty() {
                    let at = at % b.len();
                    b[at] = byte;
                }
            }
            b
        } else {
            junk
        };
        match complete(&b) {
            Ok(Need::Done(n)) => match decode(&b) {
                Ok((_, len)) => prop_assert_eq!(len, n),
                Err(e) => prop_assert!(e.1.starts_with("protocol error"), "{:?}", e),
            },
            Ok(Need::More(_)) => {}
            Err(e) => prop_assert!(e.1.starts_with("protocol error"), "{:?}", e),
        }
    }
}

/// A fuzzed reply of 200,000 nested one-element arrays overflowed the stack of `complete` (a
/// recursive walk): arrays nested past `MAX_DEPTH` are a protocol error, and a reply nested
/// that deep is read. (`fuzz/regressions/resp/` keeps the input cut to 1,000 levels.)
#[test]
fn resp_arrays_nested_200000_deep_are_refused_not_a_stack_overflow() {
    let nested = |depth: usize| [&b"*1\r\n".repeat(depth)[..], b":1\r\n"].concat();
    for depth in [200_000, MAX_DEPTH + 1] {
        let e = complete(&nested(depth)).unwrap_err();
        assert!(
            e.1.starts_with("protocol error") && e.1.contains("nested"),
            "{e:?}"
        );
    }
    let deepest = nested(MAX_DEPTH);
    assert_eq!(complete(&deepest).unwrap(), Need::Done(deepest.len()));
    let (mut v, n) = decode(&deepest).unwrap();
    assert_eq!(n, deepest.len());
    for _ in 0..MAX_DEPTH {
        let Value::Array(mut items) = v else {
            panic!("{v:?}")
        };
        v = items.pop().unwrap();
    }
    assert_eq!(v, Value::Int(1));
}

#[test]
fn errors_keep_their_kind_and_bad_replies_are_refused() {
    let (v, n) = decode(b"-MOVED 3999 127.0.0.1:6381\r\n:1\r\n").unwrap();
    assert_eq!(n, 28);
    let Value::ServerError(e) = v else {
        panic!("{v:?}")
    };
    assert_eq!(e.code(), "MOVED");
    assert_eq!(e.details(), Some("3999 127.0.0.1:6381"));
    assert!(e.is_transient());
    assert_eq!(e.to_string(), "MOVED 3999 127.0.0.1:6381");
    for bad in [&b"$3\r\nabcd\r\n"[..], b"$x\r\n", b"%1\r\n", b":12a\r\n"] {
        let e = complete(bad)
            .and_then(|_| decode(bad).map(|_| ()))
            .unwrap_err();
        assert!(e.1.starts_with("protocol error"), "{bad:?}: {e:?}");
    }
    // A bulk string larger than Redis allows is refused before anything is allocated.
    assert!(complete(b"$999999999999\r\n").is_err());
}

/// A one-shot server on a free loopback port: reads `expect` bytes, then runs `then`.
fn serve(expect: usize, then: impl FnOnce(&mut TcpStream) + Send + 'static) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut got = vec![0; expect];
        s.read_exact(&mut got).unwrap();
        then(&mut s);
    });
    addr
}

fn soon(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

#[test]
fn replies_cut_into_pieces_arrive_whole_and_in_order() {
    // 300 replies, one 600 KB bulk string among them (larger than a read), written in pieces
    // of 1 to 7000 bytes.
    let mut want = Vec::new();
    let mut wire = Vec::new();
    for i in 0..300usize {
        let v = match i % 4 {
            0 => Value::BulkString((0..(i * 37 % 1000)).map(|b| (b * i) as u8).collect()),
            1 => Value::Int(i as i64 - 150),
            2 => Value::Array(vec![Value::Okay, Value::Nil]),
            _ => Value::BulkString(Vec::new()),
        };
        v.write_resp(&mut wire);
        want.push(v);
    }
    let big: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
    Value::BulkString(big.clone()).write_resp(&mut wire);
    want.push(Value::BulkString(big));
    let addr = serve(5, move |s| {
        let mut at = 0;
        let mut k = 1usize;
        while at < wire.len() {
            k = (k * 7919 + 13) % 7000 + 1;
            let e = (at + k).min(wire.len());
            s.write_all(&wire[at..e]).unwrap();
            at = e;
        }
    });
    let mut c = Conn::connect(&addr, Duration::from_secs(2), None, soon(2000)).unwrap();
    c.send(&[b"PI", b"NG\r"], soon(2000)).unwrap();
    let mut replies = Replies::default();
    replies.reset(want.len());
    for (i, w) in want.iter().enumerate() {
        let got = c.recv_with(soon(5000), |r| {
            replies.set(i, r);
            r == Reply::Bulk(match w {
                Value::BulkString(b) => b,
                _ => &[],
            }) || r == Reply::Other(w)
        });
        assert!(got.unwrap(), "reply {i}");
    }
    assert_eq!(replies.to_values(), want);
    assert!((0..want.len()).all(|i| replies.answered(i)));
}

#[test]
fn a_silent_node_times_out_and_a_closed_one_says_so() {
    // Reads the byte, says nothing for 400 ms, then closes.
    let addr = serve(1, |_| thread::sleep(Duration::from_millis(400)));
    let mut c = Conn::connect(&addr, Duration::from_secs(2), None, soon(2000)).unwrap();
    c.send(&[b"x"], soon(1000)).unwrap();
    let t0 = Instant::now();
    let e = c.recv(soon(100)).unwrap_err();
    let took = t0.elapsed();
    assert_eq!(e.0, FailKind::Timeout, "{e:?}");
    assert!(
        took >= Duration::from_millis(99) && took < Duration::from_millis(300),
        "{took:?}"
    );
    let e = c.recv(soon(2000)).unwrap_err();
    assert_eq!(e.0, FailKind::Connect, "{e:?}");
    assert!(e.1.contains("closed"), "{e:?}");
}

#[test]
fn auth_is_sent_first_and_its_refusal_is_an_error() {
    let auth = b"*3\r\n$4\r\nAUTH\r\n$2\r\nme\r\n$6\r\nsecret\r\n";
    let addr = serve(auth.len(), |s| s.write_all(b"-WRONGPASS nope\r\n").unwrap());
    let e = Conn::connect(
        &addr,
        Duration::from_secs(2),
        Some((Some("me"), "secret")),
        soon(2000),
    )
    .unwrap_err();
    assert_eq!(e.0, FailKind::Server, "{e:?}");
    assert!(e.1.contains("WRONGPASS"), "{e:?}");
    let addr = serve(auth.len(), |s| s.write_all(b"+OK\r\n:7\r\n").unwrap());
    let mut c = Conn::connect(
        &addr,
        Duration::from_secs(2),
        Some((Some("me"), "secret")),
        soon(2000),
    )
    .unwrap();
    assert_eq!(c.recv(soon(2000)).unwrap(), Value::Int(7));
}
