//! Protocol decode and encode, per command.

#![allow(clippy::unwrap_used)]

use bytes::BytesMut;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use idem_protocol::cmd::{Claim, Complete, Release, Settle};
use idem_protocol::{ClaimReply, Command, Frame, Limits, OnExpire, Reply, Version, decode, encode};

fn commands() -> Vec<(&'static str, Command)> {
    let key = bytes::Bytes::from_static(b"tenant-a:checkout:v2:order-12345");
    vec![
        ("ping", Command::Ping(Default::default())),
        (
            "claim",
            Command::Claim(Claim {
                lease_ms: Some(30_000),
                ..Claim::new(key.clone())
            }),
        ),
        (
            "claim_full",
            Command::Claim(Claim {
                key: key.clone(),
                lease_ms: Some(30_000),
                retain_ms: Some(86_400_000),
                wait_ms: Some(5000),
                fingerprint: Some(bytes::Bytes::from_static(&[7u8; 64])),
                on_expire: Some(OnExpire::Recover),
                attempt: Some(bytes::Bytes::from_static(
                    b"0123456789abcdef0123456789abcdef",
                )),
            }),
        ),
        (
            "settle",
            Command::Settle(Settle {
                key: key.clone(),
                wait_ms: Some(100),
            }),
        ),
        (
            "complete_64b",
            Command::Complete(Complete {
                key: key.clone(),
                fence: 123_456,
                value: vec![b'v'; 64].into(),
                retain_ms: None,
                error: false,
            }),
        ),
        (
            "release",
            Command::Release(Release {
                key,
                fence: 123_456,
            }),
        ),
    ]
}

fn bench(c: &mut Criterion) {
    let limits = Limits::default();
    let mut g = c.benchmark_group("decode+parse");
    for (name, cmd) in commands() {
        let mut wire = BytesMut::new();
        encode(&cmd.to_frame(), Version::Resp2, &mut wire);
        let wire = wire.freeze();
        g.throughput(Throughput::Bytes(wire.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut buf = BytesMut::from(&wire[..]);
                let frame = decode(&mut buf, &limits).unwrap().unwrap();
                Command::from_frame(frame).unwrap()
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("encode");
    for (name, cmd) in commands() {
        g.bench_function(format!("request_{name}"), |b| {
            let mut out = BytesMut::with_capacity(4096);
            b.iter(|| {
                out.clear();
                encode(&cmd.to_frame(), Version::Resp2, &mut out);
            })
        });
    }
    let replies = [
        (
            "acquired",
            Reply::Claim(ClaimReply::Acquired { fence: 123_456 }),
        ),
        (
            "completed_64b",
            Reply::Claim(ClaimReply::Completed {
                outcome: idem_protocol::Outcome::Ok,
                value: vec![b'v'; 64].into(),
            }),
        ),
        ("ok", Reply::Ok),
        ("pong", Reply::Frame(Frame::simple("PONG"))),
    ];
    for (name, reply) in replies {
        g.bench_function(format!("reply_{name}"), |b| {
            let mut out = BytesMut::with_capacity(4096);
            b.iter(|| {
                out.clear();
                encode(&reply.to_frame(), Version::Resp2, &mut out);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
