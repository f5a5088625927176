//! Property tests: the decoder never panics on any input, however it is
//! split, and valid frames round-trip through encode and decode.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

use crate::frame::{Frame, Limits, Version, encode};

fn frame_strategy() -> impl Strategy<Value = Frame> {
    let leaf = prop_oneof![
        "[a-zA-Z0-9 _:.]{0,20}".prop_map(|s| Frame::Simple(Bytes::from(s))),
        "[A-Z]{1,8} [a-z ]{0,20}".prop_map(|s| Frame::Error(Bytes::from(s))),
        any::<i64>().prop_map(Frame::Integer),
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(|v| Frame::Bulk(Bytes::from(v))),
        Just(Frame::Null),
        any::<bool>().prop_map(Frame::Boolean),
        (-1e9f64..1e9).prop_map(Frame::Double),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Frame::Array),
            proptest::collection::vec((inner.clone(), inner), 0..4).prop_map(Frame::Map),
        ]
    })
}

/// Feeds `wire` to the decoder in pieces cut at `cuts`, collecting frames.
fn feed(wire: &[u8], cuts: &[usize], limits: &Limits) -> Result<Vec<Frame>, crate::FrameError> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
    points.push(wire.len());
    points.sort_unstable();
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut from = 0;
    // The resumable decoder the server uses.
    let mut decoder = crate::Decoder::new();
    for p in points {
        buf.extend_from_slice(&wire[from..p]);
        from = p;
        while let Some(f) = decoder.decode(&mut buf, limits)? {
            out.push(f);
        }
    }
    Ok(out)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512),
                                cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
        let _ = feed(&data, &cuts, &Limits::default());
        let _ = feed(&data, &cuts, &Limits::for_replies());
    }

    #[test]
    fn resp_like_bytes_never_panic(parts in proptest::collection::vec(
            prop_oneof![Just("*".to_string()), Just("$".to_string()), Just("%".to_string()), Just("\r\n".to_string()),
                        Just("-1".to_string()), Just(":".to_string()), Just("#t".to_string()), Just("_".to_string()),
                        Just(",".to_string()), "[0-9]{1,3}", "[a-z]{0,3}"], 0..40),
            cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
        let data = parts.concat();
        let _ = feed(data.as_bytes(), &cuts, &Limits::default());
        let _ = feed(data.as_bytes(), &cuts, &Limits::for_replies());
    }

    #[test]
    fn valid_frames_round_trip_split_anywhere(frames in proptest::collection::vec(frame_strategy(), 1..5),
                                             cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
        let mut wire = BytesMut::new();
        for f in &frames {
            encode(f, Version::Resp3, &mut wire);
        }
        let got = feed(&wire, &cuts, &Limits::for_replies()).unwrap();
        prop_assert_eq!(got.len(), frames.len());
        for (g, f) in got.iter().zip(&frames) {
            // Doubles are compared by their printed form (the wire is text).
            prop_assert_eq!(format!("{g:?}"), format!("{f:?}"));
        }
    }

    #[test]
    fn commands_round_trip_split_anywhere(idx in any::<usize>(), cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
        let cmds = crate::cmd::tests::all_commands();
        let cmd = &cmds[idx % cmds.len()];
        let mut wire = BytesMut::new();
        encode(&cmd.to_frame(), Version::Resp2, &mut wire);
        encode(&cmd.to_frame(), Version::Resp2, &mut wire);
        let got = feed(&wire, &cuts, &Limits::default()).unwrap();
        prop_assert_eq!(got.len(), 2);
        for g in got {
            prop_assert_eq!(&crate::Command::from_frame(g).unwrap(), cmd);
        }
    }
}
