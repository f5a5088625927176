//! Entry points for the fuzz targets in `fuzz/` (cargo-fuzz): each takes
//! hostile input, runs it through one parser or the state machine, and
//! panics only when an invariant breaks (a decoder that disagrees with
//! itself, a round trip that changes a value, a snapshot that does not
//! restore to the same state). A panic on input anywhere is a bug.

use std::path::Path;

use bytes::{Bytes, BytesMut};
use idem_protocol::cmd::{
    Abandon, Claim, Complete, Forget, Inspect, Journal, OnExpire, Release, Renew, Settle,
};
use idem_protocol::{Command, Decoder, Frame, Limits, Version, decode, encode};

use crate::store::{Defaults, Entry, Op, Read, Store, StoreConfig};

/// Limits small enough that the fuzzer reaches them.
fn limits() -> Limits {
    Limits {
        max_bulk: 16 * 1024,
        max_array: 64,
        max_inline: 4096,
        max_frame: 64 * 1024,
        ..Limits::default()
    }
}

/// The RESP decoder: whole input and the same input in two pieces (at a
/// point the input picks) decode to the same frames; every frame encodes
/// and decodes back to itself.
pub fn frames(data: &[u8]) {
    let limits = limits();
    let whole = decode_all(data, data.len(), &limits);
    let split = data
        .first()
        .map_or(0, |&b| usize::from(b) % (data.len() + 1));
    let pieces = decode_all(data, split, &limits);
    assert_eq!(whole, pieces, "the decoder depends on how input arrives");
    for f in whole.0.iter() {
        for v in [Version::Resp2, Version::Resp3] {
            let mut out = BytesMut::new();
            encode(f, v, &mut out);
            let mut again = out.clone();
            // What the server sends decodes as a reply.
            let back = decode(&mut again, &Limits::for_replies());
            assert!(back.is_ok(), "an encoded frame does not decode: {f:?}");
        }
    }
}

/// Frames decoded from `data` fed in two pieces (the first `split` bytes,
/// then the rest), and whether the input is malformed.
///
/// The resuming decoder looks at a pending frame again only once a `\n`
/// arrives (or the buffer passes the inline limit): a malformed frame
/// trickled in without one is reported when it is next looked at, not
/// before. So what is left at the end is checked once more from scratch,
/// as the next newline would.
fn decode_all(data: &[u8], split: usize, limits: &Limits) -> (Vec<Frame>, bool) {
    let mut d = Decoder::new();
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for piece in [&data[..split], &data[split..]] {
        buf.extend_from_slice(piece);
        loop {
            match d.decode(&mut buf, limits) {
                Ok(Some(f)) => out.push(f),
                Ok(None) => break,
                Err(_) => return (out, true),
            }
        }
    }
    let malformed = idem_protocol::frame::check(&buf, limits).is_err();
    (out, malformed)
}

/// The command parser: every frame decoded from `data` either parses or is
/// refused with an error; a parsed command encodes to a frame that parses
/// back to the same command.
pub fn commands(data: &[u8]) {
    let limits = limits();
    let (frames, _) = decode_all(data, data.len(), &limits);
    for f in frames {
        if let Ok(cmd) = Command::from_frame(f) {
            let again = Command::from_frame(cmd.to_frame());
            assert_eq!(again.as_ref(), Ok(&cmd), "a command does not round-trip");
            let _ = cmd.spec();
            let _ = cmd.key();
            let _ = crate::acl::Acl::build(None, std::iter::empty())
                .map(|acl| acl.default_user().check(&cmd));
        }
    }
}

/// One step of a store run, as the fuzzer picks it.
#[derive(Debug, Clone)]
pub struct Step {
    /// Which command (modulo their number).
    pub kind: u8,
    /// Which of a few keys.
    pub key: u8,
    /// How far below the latest fence the fence given is.
    pub fence_back: u8,
    /// A lease, retention or wait, ms.
    pub ms: u16,
    /// Time passing before the step, ms.
    pub advance_ms: u16,
    /// A value, journal, fingerprint or attempt id.
    pub data: Vec<u8>,
}

/// The state machine: any sequence of commands and expiries applies
/// without a panic; reads answer; and at every tenth step the snapshot
/// restores to a store whose snapshot is the same bytes, as does a second
/// store fed the same entries (apply is deterministic).
pub fn store_steps(steps: &[Step]) {
    let cfg = StoreConfig {
        shards: 4,
        seed: Some(7),
    };
    let store = Store::new(cfg.clone());
    let twin = Store::new(StoreConfig {
        shards: 8,
        seed: Some(11),
    });
    let defaults = Defaults {
        lease_ms: 1000,
        retain_ms: 5000,
    };
    let mut now = 1_000u64;
    let mut last_fence = 0u64;
    for (i, s) in steps.iter().enumerate() {
        now += u64::from(s.advance_ms);
        let key = Bytes::from(format!("k{}", s.key % 4));
        let fence = last_fence
            .saturating_sub(u64::from(s.fence_back % 4))
            .max(1);
        let ms = u64::from(s.ms).max(1);
        let data = Bytes::copy_from_slice(&s.data);
        let cmd = match s.kind % 11 {
            0 | 1 => Command::Claim(Claim {
                key: key.clone(),
                lease_ms: Some(ms),
                retain_ms: (s.ms % 3 == 0).then_some(ms * 2),
                wait_ms: None,
                fingerprint: (s.kind & 0x10 != 0).then(|| data.clone()),
                on_expire: (s.kind & 0x20 != 0).then_some(OnExpire::Recover),
                attempt: (s.kind & 0x40 != 0).then(|| data.clone()),
            }),
            2 => Command::Complete(Complete {
                key: key.clone(),
                fence,
                value: data,
                retain_ms: (s.ms % 2 == 0).then_some(ms),
                error: s.kind & 0x80 != 0,
            }),
            3 => Command::Renew(Renew {
                key: key.clone(),
                fence,
                lease_ms: ms,
            }),
            4 => Command::Journal(Journal {
                key: key.clone(),
                fence,
                journal: data,
            }),
            5 => Command::Release(Release {
                key: key.clone(),
                fence,
            }),
            6 => Command::Abandon(Abandon {
                key: key.clone(),
                fence,
            }),
            7 => Command::Forget(Forget { key: key.clone() }),
            8 => Command::Settle(Settle {
                key: key.clone(),
                wait_ms: None,
            }),
            9 => Command::Inspect(Inspect { key: key.clone() }),
            _ => {
                let entry = Entry {
                    stamp_ms: now,
                    ops: vec![Op::Expire {
                        keys: (0..4).map(|k| Bytes::from(format!("k{k}"))).collect(),
                    }],
                };
                store.apply(&entry);
                twin.apply(&entry);
                continue;
            }
        };
        match &cmd {
            Command::Settle(c) => {
                let _ = store.read(Read::Settle(&c.key), now);
            }
            Command::Inspect(c) => {
                let _ = store.read(Read::Inspect(&c.key), now);
            }
            _ => {
                if let Some(op) = Op::from_command(cmd, &defaults) {
                    let entry = Entry {
                        stamp_ms: now,
                        ops: vec![op],
                    };
                    let a = store.apply(&entry);
                    let b = twin.apply(&entry);
                    assert_eq!(
                        format!("{:?}", a.iter().map(|x| &x.reply).collect::<Vec<_>>()),
                        format!("{:?}", b.iter().map(|x| &x.reply).collect::<Vec<_>>()),
                        "two stores answered one entry differently"
                    );
                }
            }
        }
        last_fence = store.stats().last_fence;
        if i % 10 == 9 {
            let snap = store.snapshot();
            let restored = Store::restore(cfg.clone(), &snap).expect("a snapshot restores");
            assert_eq!(restored.snapshot(), snap, "a snapshot does not round-trip");
            assert_eq!(twin.snapshot(), snap, "two stores diverged");
        }
    }
}

/// Snapshot restore: any bytes are refused or restore to a store whose
/// snapshot restores again to the same bytes.
///
/// The snapshot ends with a CRC of the rest, which random mutations almost
/// never match: each input is also tried with the CRC made right, so the
/// records' decoder is reached.
pub fn snapshot(data: &[u8]) {
    restore_twice(data);
    if data.len() >= 16 {
        let mut fixed = data.to_vec();
        let n = fixed.len() - 4;
        let crc = crc32fast::hash(&fixed[..n]);
        fixed[n..].copy_from_slice(&crc.to_le_bytes());
        restore_twice(&fixed);
    }
}

fn restore_twice(data: &[u8]) {
    let cfg = StoreConfig {
        shards: 4,
        seed: Some(3),
    };
    if let Ok(store) = Store::restore(cfg.clone(), data) {
        let snap = store.snapshot();
        let again = Store::restore(cfg, &snap).expect("a snapshot it wrote restores");
        assert_eq!(again.snapshot(), snap);
    }
}

/// The log: `data` as the segment file in `dir` (its log files removed
/// first) opens as a
/// log or is refused as damaged; what opens decodes entry by entry without
/// a panic, and opens the same way a second time.
///
/// Every record carries a CRC, which random mutations almost never match:
/// each input is also tried with its records' CRCs made right, so what
/// lies past them (index order, torn tails, entry decoding) is reached.
pub fn wal_segment(dir: &Path, data: &[u8]) {
    open_segment(dir, data);
    let fixed = with_record_crcs(data);
    if fixed != data {
        open_segment(dir, &fixed);
    }
}

/// `data` with the CRC of every record that fits made right (records
/// follow a 20-byte header: length, CRC, then index and payload).
fn with_record_crcs(data: &[u8]) -> Vec<u8> {
    let mut out = data.to_vec();
    let mut at = 20;
    while at + 8 <= out.len() {
        let len = u32::from_le_bytes([out[at], out[at + 1], out[at + 2], out[at + 3]]) as usize;
        let end = at + 8 + len;
        if len < 8 || end > out.len() {
            break;
        }
        let mut h = crc32fast::Hasher::new();
        h.update(&out[at + 8..at + 16]);
        h.update(&out[at + 16..end]);
        let crc = h.finalize();
        out[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
        at = end;
    }
    out
}

fn open_segment(dir: &Path, data: &[u8]) {
    use crate::engine::raft::wal::Wal;
    std::fs::create_dir_all(dir).expect("a scratch directory");
    // Only the log's own files are removed (the segments and its meta).
    for e in std::fs::read_dir(dir)
        .expect("a scratch directory")
        .flatten()
    {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".wal") || name == "meta" {
            let _ = std::fs::remove_file(e.path());
        }
    }
    std::fs::write(dir.join("00000000000000000000.wal"), data).expect("write the segment");
    let first = Wal::open(dir, 0).map(|(_, records)| records);
    if let Ok(records) = &first {
        for (_, payload) in records {
            let _ = crate::store::codec::decode_entry(Bytes::copy_from_slice(payload));
        }
        // What was kept (a torn tail cut off) opens again to the same.
        let again = Wal::open(dir, 0).map(|(_, r)| r);
        assert_eq!(
            again.ok().as_ref(),
            Some(records),
            "a log reopens differently"
        );
    }
    let _ = crate::store::codec::decode_entry(Bytes::copy_from_slice(data));
}

/// The peer protocol's frames: length-delimited, each read as every
/// message a peer may send.
pub fn peer_frames(data: &[u8]) {
    crate::engine::raft::peer::decode_for_fuzzing(data);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every seed (and every crash input kept) of every target runs
    /// through its entry point without a panic: the fuzz targets' seeds
    /// stay valid, and a fixed crash stays fixed.
    #[test]
    fn the_seed_corpus_passes_every_entry_point() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
        let scratch = std::env::temp_dir().join(format!("idem-fuzz-seeds-{}", std::process::id()));
        let mut ran = 0;
        for (target, run) in [
            ("frames", frames as fn(&[u8])),
            ("commands", commands),
            ("snapshot", snapshot),
            ("peer_frames", peer_frames),
        ] {
            for e in std::fs::read_dir(root.join(target)).unwrap() {
                run(&std::fs::read(e.unwrap().path()).unwrap());
                ran += 1;
            }
        }
        for e in std::fs::read_dir(root.join("wal_segment")).unwrap() {
            wal_segment(&scratch, &std::fs::read(e.unwrap().path()).unwrap());
            ran += 1;
        }
        let _ = std::fs::remove_dir_all(&scratch);
        assert!(ran > 80, "only {ran} seeds");
    }

    /// A run of every command kind, with time passing and snapshots
    /// checked along the way.
    #[test]
    fn a_store_run_keeps_its_invariants() {
        let steps: Vec<Step> = (0..400u32)
            .map(|i| Step {
                kind: (i * 7 % 256) as u8,
                key: (i % 5) as u8,
                fence_back: (i % 3) as u8,
                ms: (i * 37 % 3000) as u16,
                advance_ms: (i * 13 % 700) as u16,
                data: vec![i as u8; (i % 9) as usize],
            })
            .collect();
        store_steps(&steps);
    }

    /// A malformed frame trickled in without a newline is reported once
    /// the rest is checked, as it is whole (found by the `frames` target).
    #[test]
    fn a_split_malformed_frame_is_malformed() {
        let data = b"*2\r\n$4\r\nECHO\r\n$1\r\nx\rJ";
        assert_eq!(decode_all(data, data.len(), &limits()), (vec![], true));
        assert_eq!(decode_all(data, 20, &limits()), (vec![], true));
    }
}
