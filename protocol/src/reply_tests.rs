//! Round trips of every typed reply through both protocol versions.

use bytes::{Bytes, BytesMut};

use crate::frame::{Frame, Limits, Version, decode, encode};
use crate::reply::*;

fn wire(frame: &Frame, v: Version) -> Frame {
    let mut buf = BytesMut::new();
    encode(frame, v, &mut buf);
    let f = decode(&mut buf, &Limits::for_replies()).unwrap().unwrap();
    assert!(buf.is_empty());
    f
}

#[test]
fn claim_replies_round_trip() {
    let replies = [
        ClaimReply::Acquired { fence: 1 },
        ClaimReply::Completed {
            outcome: Outcome::Ok,
            value: Bytes::from_static(b"\x00bin\r\n"),
        },
        ClaimReply::Completed {
            outcome: Outcome::Err,
            value: Bytes::new(),
        },
        ClaimReply::InFlight { remaining_ms: 5 },
        ClaimReply::Recover {
            fence: u64::MAX >> 1,
            journal: Bytes::from_static(b"j"),
        },
    ];
    for r in replies {
        for v in [Version::Resp2, Version::Resp3] {
            assert_eq!(
                ClaimReply::from_frame(wire(&Reply::Claim(r.clone()).to_frame(), v)).unwrap(),
                r
            );
        }
    }
}

#[test]
fn settle_replies_round_trip() {
    let replies = [
        SettleReply::Completed {
            outcome: Outcome::Err,
            value: Bytes::from_static(b"declined"),
        },
        SettleReply::Absent,
        SettleReply::Abandoned {
            journal: Bytes::from_static(b"step-2"),
        },
        SettleReply::InFlight { remaining_ms: 0 },
    ];
    for r in replies {
        for v in [Version::Resp2, Version::Resp3] {
            assert_eq!(
                SettleReply::from_frame(wire(&Reply::Settle(r.clone()).to_frame(), v)).unwrap(),
                r
            );
        }
    }
}

#[test]
fn inspect_replies_round_trip() {
    let full = RecordInfo {
        state: RecordState::Completed,
        fence: 9,
        lease_ms: None,
        retain_ms: Some(100),
        outcome: Some(Outcome::Ok),
        value: Some(Bytes::from_static(b"v")),
        fingerprint: Some(Bytes::from_static(b"fp")),
        journal: None,
        attempt: None,
    };
    let flying = RecordInfo {
        state: RecordState::InFlight,
        fence: 2,
        lease_ms: Some(30),
        retain_ms: None,
        outcome: None,
        value: None,
        fingerprint: None,
        journal: Some(Bytes::new()),
        attempt: Some(Bytes::from_static(b"a")),
    };
    for r in [Some(full), Some(flying), None] {
        for v in [Version::Resp2, Version::Resp3] {
            assert_eq!(
                RecordInfo::from_frame(wire(
                    &Reply::Inspect(r.clone().map(Box::new)).to_frame(),
                    v
                ))
                .unwrap(),
                r
            );
        }
    }
}

#[test]
fn errors_round_trip_with_their_codes() {
    let errors = [
        ServerError::new(ErrorCode::Err, "syntax error"),
        ServerError::new(ErrorCode::Mismatch, "fingerprint differs"),
        ServerError::new(ErrorCode::Fenced, "not the owner"),
        ServerError::new(ErrorCode::TooBig, "value over 1048576 bytes"),
        ServerError::new(ErrorCode::Oom, "at max_memory"),
        ServerError::new(ErrorCode::NoAuth, "authentication required"),
        ServerError::new(ErrorCode::NoPerm, "no"),
        ServerError::new(ErrorCode::WrongPass, "invalid"),
        ServerError::new(ErrorCode::Moved, "3999 10.0.0.2:7379"),
        ServerError::new(ErrorCode::ClusterDown, "no leader"),
        ServerError::new(ErrorCode::TryAgain, "no leader"),
        ServerError::new(ErrorCode::NoProto, "unsupported protocol version"),
    ];
    for e in errors {
        let f = wire(&Reply::Error(e.clone()).to_frame(), Version::Resp2);
        let Frame::Error(text) = &f else {
            panic!("not an error frame")
        };
        assert_eq!(ServerError::parse(text), e);
        assert_eq!(ClaimReply::from_frame(f), Err(Ok(e)));
    }
    assert_eq!(ServerError::parse(b"WEIRD thing").code, ErrorCode::Err);
}

#[test]
fn malformed_replies_are_errors_not_panics() {
    assert!(ClaimReply::from_frame(Frame::Array(vec![])).is_err());
    assert!(ClaimReply::from_frame(Frame::Array(vec![Frame::simple("ACQUIRED")])).is_err());
    assert!(
        ClaimReply::from_frame(Frame::Array(vec![
            Frame::simple("ACQUIRED"),
            Frame::Integer(-1)
        ]))
        .is_err()
    );
    assert!(SettleReply::from_frame(Frame::Integer(3)).is_err());
    assert!(RecordInfo::from_frame(Frame::Array(vec![Frame::Null])).is_err());
    assert!(RecordInfo::from_frame(Frame::Map(vec![])).is_err());
}

#[test]
fn direct_encoding_matches_the_frame_encoding() {
    let replies = vec![
        Reply::Ok,
        Reply::Claim(ClaimReply::Acquired { fence: 42 }),
        Reply::Claim(ClaimReply::InFlight { remaining_ms: 7 }),
        Reply::Claim(ClaimReply::Completed {
            outcome: Outcome::Err,
            value: Bytes::from_static(b"v\r\nx"),
        }),
        Reply::Claim(ClaimReply::Recover {
            fence: 3,
            journal: Bytes::from_static(b"j"),
        }),
        Reply::Settle(SettleReply::Completed {
            outcome: Outcome::Ok,
            value: Bytes::new(),
        }),
        Reply::Settle(SettleReply::InFlight { remaining_ms: 0 }),
        Reply::Settle(SettleReply::Absent),
        Reply::Settle(SettleReply::Abandoned {
            journal: Bytes::from_static(b"j"),
        }),
        Reply::Inspect(None),
        Reply::Error(ServerError::new(ErrorCode::Fenced, "no")),
        Reply::Frame(Frame::Map(vec![(Frame::simple("a"), Frame::Null)])),
    ];
    for r in replies {
        for v in [Version::Resp2, Version::Resp3] {
            let mut direct = BytesMut::new();
            r.encode(v, &mut direct);
            let mut framed = BytesMut::new();
            encode(&r.to_frame(), v, &mut framed);
            assert_eq!(direct, framed, "{r:?}");
        }
    }
}

#[test]
fn every_error_code_is_listed_once_at_its_index_and_parses_back() {
    for (i, code) in ErrorCode::ALL.iter().enumerate() {
        assert_eq!(code.index(), i, "{code:?} out of place");
        let parsed = ServerError::parse(format!("{} text", code.as_str()).as_bytes());
        assert_eq!(parsed.code, *code);
        assert_eq!(parsed.message, "text");
    }
    // Every variant, by an exhaustive match: a new one does not compile
    // here until it is given its place, and must then be in ALL there.
    fn place(c: ErrorCode) -> usize {
        match c {
            ErrorCode::Err => 0,
            ErrorCode::Mismatch => 1,
            ErrorCode::Fenced => 2,
            ErrorCode::TooBig => 3,
            ErrorCode::Oom => 4,
            ErrorCode::NoAuth => 5,
            ErrorCode::NoPerm => 6,
            ErrorCode::WrongPass => 7,
            ErrorCode::TryAgain => 8,
            ErrorCode::NoProto => 9,
            ErrorCode::Moved => 10,
            ErrorCode::ClusterDown => 11,
        }
    }
    const VARIANTS: usize = 12;
    assert_eq!(ErrorCode::ALL.len(), VARIANTS);
    for code in ErrorCode::ALL {
        assert_eq!(ErrorCode::ALL[place(code)], code);
    }
    let mut words: Vec<_> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    words.sort_unstable();
    words.dedup();
    assert_eq!(words.len(), ErrorCode::ALL.len());
}
