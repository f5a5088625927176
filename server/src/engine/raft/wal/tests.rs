#![allow(clippy::single_range_in_vec_init)] // batches of records, written as ranges

use std::fs;
use std::path::{Path, PathBuf};

use super::{HEADER_LEN, Wal, WalError, ZERO_AHEAD, read_meta, write_meta};

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "idem-wal-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn payload(i: u64) -> Vec<u8> {
    format!("entry-{i}-{}", "x".repeat((i % 7) as usize * 13)).into_bytes()
}

fn fill(dir: &Path, segment_bytes: u64, batches: &[std::ops::Range<u64>]) -> Wal {
    let (mut wal, recs) = Wal::open(dir, segment_bytes).unwrap();
    assert!(recs.is_empty());
    for b in batches {
        let data: Vec<(u64, Vec<u8>)> = b.clone().map(|i| (i, payload(i))).collect();
        wal.append(data.iter().map(|(i, p)| (*i, &p[..]))).unwrap();
    }
    wal
}

/// Where each record of a segment's bytes ends (up to the zeros after
/// them).
fn record_ends(bytes: &[u8]) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut at = HEADER_LEN as usize;
    while at + 4 <= bytes.len() {
        let len = u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        if len == 0 {
            break;
        }
        at += 8 + len as usize;
        ends.push(at);
    }
    ends
}

fn indexes(recs: &[(u64, Vec<u8>)]) -> Vec<u64> {
    recs.iter().map(|r| r.0).collect()
}

#[test]
fn records_survive_reopening_across_segments() {
    let d = TempDir::new("reopen");
    let wal = fill(&d.0, 300, &[1..4, 4..20, 20..21]);
    assert!(wal.segment_paths().len() > 2, "small segments roll over");
    assert_eq!(wal.syncs as usize, 3 + wal.segment_paths().len() - 1);
    drop(wal);
    let (wal, recs) = Wal::open(&d.0, 300).unwrap();
    assert_eq!(indexes(&recs), (1..21).collect::<Vec<_>>());
    for (i, p) in &recs {
        assert_eq!(p, &payload(*i));
    }
    assert_eq!(wal.first_index(), 1);
    assert_eq!(wal.next_index(), 21);
}

/// A restart that keeps only the records past a snapshot gets only those
/// (the rest are not copied out of the segments), still checks every
/// record, and can append and truncate as if it had read them all.
#[test]
fn records_a_snapshot_covers_are_checked_but_not_copied_out() {
    let d = TempDir::new("keep-from");
    drop(fill(&d.0, 300, &[1..10, 10..25]));
    let (mut wal, recs) = Wal::open_from(&d.0, 300, 18).unwrap();
    assert_eq!(indexes(&recs), (18..25).collect::<Vec<_>>());
    for (i, p) in &recs {
        assert_eq!(p, &payload(*i));
    }
    assert_eq!(
        wal.first_index(),
        1,
        "the records before are still in the log"
    );
    assert_eq!(wal.next_index(), 25);
    wal.truncate_from(20).unwrap();
    wal.append([(20, &b"after"[..])]).unwrap();
    drop(wal);
    let (_, recs) = Wal::open_from(&d.0, 300, 0).unwrap();
    assert_eq!(indexes(&recs), (1..21).collect::<Vec<_>>());
    assert_eq!(recs.last().map(|r| &r.1[..]), Some(&b"after"[..]));
    // Past the end: nothing copied, the log as it was.
    let (wal, recs) = Wal::open_from(&d.0, 300, 1_000).unwrap();
    assert!(recs.is_empty());
    assert_eq!((wal.first_index(), wal.next_index()), (1, 21));
    drop(wal);
    // A damaged record the snapshot covers is still an error.
    let first = d.0.join(super::segment_name(1));
    let mut bytes = fs::read(&first).unwrap();
    let ends = record_ends(&bytes);
    bytes[ends[0] + 12] ^= 0x55;
    fs::write(&first, &bytes).unwrap();
    assert!(matches!(
        Wal::open_from(&d.0, 300, 18),
        Err(WalError::Corrupt { .. })
    ));
}

#[test]
fn truncate_and_purge() {
    let d = TempDir::new("trunc");
    let mut wal = fill(&d.0, 300, &[1..30]);
    wal.truncate_from(25).unwrap();
    assert_eq!(wal.next_index(), 25);
    wal.append([(25, &b"new"[..])]).unwrap();
    let dropped = wal.purge_upto(10).unwrap();
    assert!(dropped > 0 && dropped <= 10);
    let first = wal.first_index();
    drop(wal);
    let (_, recs) = Wal::open(&d.0, 300).unwrap();
    assert_eq!(recs.first().map(|r| r.0), Some(first));
    assert_eq!(
        recs.last().map(|r| (r.0, r.1.clone())),
        Some((25, b"new".to_vec()))
    );
    assert_eq!(indexes(&recs), (first..26).collect::<Vec<_>>());
}

/// A purge forgets where the records it covers start, in the segment
/// being written too (they are never read or cut again): a quiet server
/// kept 16 bytes for each record of that segment until it was full. The
/// log still appends, truncates and reads back as before, and later
/// purges still remove whole segments.
#[test]
fn a_purge_within_the_segment_being_written_forgets_its_records() {
    let d = TempDir::new("purge-within");
    let mut wal = fill(&d.0, 1 << 20, &[1..1001]);
    assert_eq!(wal.segment_paths().len(), 1);
    let capacity = wal.slots.capacity();
    assert_eq!(wal.purge_upto(990).unwrap(), 0, "no segment removed");
    assert_eq!(wal.slots.len(), 10, "slots kept for purged records");
    assert!(wal.slots.capacity() < capacity / 4);
    assert_eq!((wal.first_index(), wal.next_index()), (1, 1001));
    wal.truncate_from(995).unwrap();
    assert!(wal.append([(997, &b"gap"[..])]).is_err());
    wal.append([(995, &b"after"[..])]).unwrap();
    // A purge of every record keeps the last slot: the log is not empty.
    wal.purge_upto(995).unwrap();
    assert_eq!(wal.slots.len(), 1);
    assert_eq!(wal.next_index(), 996);
    assert!(wal.append([(997, &b"gap"[..])]).is_err());
    drop(wal);
    let (wal, recs) = Wal::open(&d.0, 1 << 20).unwrap();
    assert_eq!(indexes(&recs), (1..996).collect::<Vec<_>>());
    assert_eq!(recs.last().map(|r| &r.1[..]), Some(&b"after"[..]));
    assert_eq!(wal.next_index(), 996);
    // Small segments: a purge within one, then one past it.
    let d = TempDir::new("purge-within-small");
    let mut wal = fill(&d.0, 300, &[1..40]);
    let firsts: Vec<u64> = wal.segments.iter().map(|s| s.first).collect();
    assert!(firsts.len() > 3);
    let in_second = firsts[1] + 1;
    assert_eq!(wal.purge_upto(in_second).unwrap(), firsts[1] - 1);
    assert_eq!(wal.slots.len() as u64, 40 - in_second - 1);
    let dropped = wal.purge_upto(firsts[3]).unwrap();
    assert_eq!(dropped, firsts[3] - firsts[1]);
    assert_eq!(wal.first_index(), firsts[3]);
    assert_eq!(wal.next_index(), 40);
    wal.truncate_from(38).unwrap();
    wal.append([(38, &b"end"[..])]).unwrap();
    drop(wal);
    let (_, recs) = Wal::open(&d.0, 300).unwrap();
    assert_eq!(indexes(&recs), (firsts[3]..39).collect::<Vec<_>>());
}

/// A log cut back to the purge point (openraft truncates a follower's
/// uncommitted tail before installing a snapshot) still holds the records
/// before it in its files: it is not empty, so an append that does not
/// continue it is refused, and the writer starts the files afresh
/// (`reset`) for an append past a snapshot. Taken for empty, it wrote the
/// new records after the old ones, and the node could not start again.
#[test]
fn a_log_cut_back_to_its_purge_point_is_not_empty() {
    let d = TempDir::new("cut-to-purge");
    let mut wal = fill(&d.0, 1 << 20, &[1..11]);
    wal.purge_upto(5).unwrap();
    wal.truncate_from(6).unwrap();
    assert!(!wal.is_empty(), "records 1..=5 are still in the file");
    assert_eq!(wal.next_index(), 6);
    assert!(
        wal.append([(20, &b"past a snapshot"[..])]).is_err(),
        "a gap written into the log"
    );
    // A cut below the slots kept cuts nothing.
    wal.truncate_from(3).unwrap();
    assert_eq!(wal.next_index(), 6);
    wal.reset().unwrap();
    assert!(wal.is_empty());
    wal.append([(20, &b"past a snapshot"[..])]).unwrap();
    drop(wal);
    let (wal, recs) = Wal::open(&d.0, 1 << 20).unwrap();
    assert_eq!(indexes(&recs), vec![20]);
    assert_eq!(wal.next_index(), 21);
    // Continuing it instead is accepted and reads back whole.
    let d = TempDir::new("cut-to-purge-continue");
    let mut wal = fill(&d.0, 1 << 20, &[1..11]);
    wal.purge_upto(5).unwrap();
    wal.truncate_from(6).unwrap();
    wal.append([(6, &b"new six"[..])]).unwrap();
    drop(wal);
    let (_, recs) = Wal::open(&d.0, 1 << 20).unwrap();
    assert_eq!(indexes(&recs), (1..7).collect::<Vec<_>>());
    assert_eq!(recs.last().map(|r| &r.1[..]), Some(&b"new six"[..]));
}

/// Cut the last segment at every byte offset of its final batches: recovery
/// keeps exactly the records whose bytes were all there (the synced prefix),
/// and the log can be appended to again.
#[test]
fn a_cut_at_any_offset_keeps_exactly_the_whole_records() {
    let d = TempDir::new("cut");
    let wal = fill(&d.0, 1 << 20, &[1..5, 5..9, 9..12]);
    let seg = wal.segment_paths().pop().unwrap();
    drop(wal);
    let mut full = fs::read(&seg).unwrap();
    // Where each record ends, from the record lengths; the zeros after them
    // are left out (a crash before they were written leaves none).
    let ends = record_ends(&full);
    assert_eq!(ends.len(), 11);
    full.truncate(ends[10]);
    let from = ends[3]; // the last two batches, and the end of the first
    for cut in from..=full.len() {
        fs::write(&seg, &full[..cut]).unwrap();
        let (mut wal, recs) = Wal::open(&d.0, 1 << 20).unwrap();
        let whole = ends.iter().filter(|&&e| e <= cut).count() as u64;
        assert_eq!(
            indexes(&recs),
            (1..=whole).collect::<Vec<_>>(),
            "cut at {cut}"
        );
        assert_eq!(
            fs::metadata(&seg).unwrap().len() as usize,
            ends[whole as usize - 1]
        );
        // Appending continues from there.
        wal.append([(whole + 1, &b"again"[..])]).unwrap();
        drop(wal);
        let (_, recs) = Wal::open(&d.0, 1 << 20).unwrap();
        assert_eq!(recs.last().unwrap().0, whole + 1);
    }
}

#[test]
fn a_flipped_byte_in_the_last_record_is_a_torn_tail() {
    let d = TempDir::new("flip-tail");
    let wal = fill(&d.0, 1 << 20, &[1..6]);
    let seg = wal.segment_paths().pop().unwrap();
    drop(wal);
    let mut bytes = fs::read(&seg).unwrap();
    let n = *record_ends(&bytes).last().unwrap();
    bytes[n - 2] ^= 0x40;
    fs::write(&seg, &bytes).unwrap();
    let (_, recs) = Wal::open(&d.0, 1 << 20).unwrap();
    assert_eq!(indexes(&recs), vec![1, 2, 3, 4]);
}

#[test]
fn a_flipped_byte_before_valid_records_is_an_error_not_a_truncation() {
    let d = TempDir::new("flip-mid");
    let wal = fill(&d.0, 1 << 20, &[1..6]);
    let seg = wal.segment_paths().pop().unwrap();
    drop(wal);
    let mut bytes = fs::read(&seg).unwrap();
    let before = bytes.len();
    bytes[HEADER_LEN as usize + 20] ^= 0x01;
    fs::write(&seg, &bytes).unwrap();
    let err = Wal::open(&d.0, 1 << 20).unwrap_err();
    match &err {
        WalError::Corrupt { path, offset, .. } => {
            assert_eq!(path, &seg);
            assert_eq!(*offset, HEADER_LEN);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(err.to_string().contains(&seg.display().to_string()));
    assert_eq!(
        fs::metadata(&seg).unwrap().len() as usize,
        before,
        "never truncated"
    );
}

#[test]
fn damage_in_an_older_segment_is_an_error() {
    let d = TempDir::new("old");
    let wal = fill(&d.0, 200, &[1..20]);
    let first = wal.segment_paths()[0].clone();
    drop(wal);
    let mut bytes = fs::read(&first).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 0xff;
    fs::write(&first, &bytes).unwrap();
    assert!(matches!(
        Wal::open(&d.0, 200),
        Err(WalError::Corrupt { path, .. }) if path == first
    ));
}

#[test]
fn newer_and_foreign_formats_are_refused() {
    let d = TempDir::new("version");
    let wal = fill(&d.0, 1 << 20, &[1..3]);
    let seg = wal.segment_paths().pop().unwrap();
    drop(wal);
    let mut bytes = fs::read(&seg).unwrap();
    bytes[8] = 9;
    fs::write(&seg, &bytes).unwrap();
    let e = Wal::open(&d.0, 1 << 20).unwrap_err();
    assert!(matches!(e, WalError::Version { found: 9, .. }), "{e}");
    assert!(e.to_string().contains("version 9"));
    bytes[..8].copy_from_slice(b"REDIS001");
    fs::write(&seg, &bytes).unwrap();
    assert!(matches!(
        Wal::open(&d.0, 1 << 20),
        Err(WalError::Corrupt { offset: 0, .. })
    ));
}

#[test]
fn meta_is_replaced_atomically_and_checked() {
    let d = TempDir::new("meta");
    assert_eq!(read_meta(&d.0).unwrap(), None);
    write_meta(&d.0, b"vote=1").unwrap();
    write_meta(&d.0, b"vote=2").unwrap();
    assert_eq!(read_meta(&d.0).unwrap().as_deref(), Some(&b"vote=2"[..]));
    assert!(!d.0.join("meta.tmp").exists());
    let mut bytes = fs::read(d.0.join("meta")).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    fs::write(d.0.join("meta"), &bytes).unwrap();
    assert!(matches!(read_meta(&d.0), Err(WalError::Corrupt { .. })));
}

#[test]
fn a_missing_segment_is_an_error_not_a_gap() {
    let d = TempDir::new("gap");
    let wal = fill(&d.0, 200, &[1..30]);
    let segs = wal.segment_paths();
    assert!(segs.len() >= 3);
    drop(wal);
    fs::remove_file(&segs[1]).unwrap();
    let e = Wal::open(&d.0, 200).unwrap_err();
    assert!(
        matches!(&e, WalError::Corrupt { path, .. } if path == &segs[2]),
        "{e}"
    );
}

#[test]
fn oversized_records_are_refused_before_writing() {
    let d = TempDir::new("big");
    let (mut wal, _) = Wal::open(&d.0, 1 << 20).unwrap();
    let big = vec![0u8; super::MAX_RECORD as usize];
    assert!(wal.append([(1, &big[..])]).is_err());
    assert!(wal.is_empty());
}

#[test]
fn a_last_segment_whose_header_never_reached_the_disk_is_recreated() {
    let d = TempDir::new("zero-header");
    let wal = fill(&d.0, 200, &[1..20]);
    let next = wal.next_index();
    let segs = wal.segment_paths();
    drop(wal);
    // A crash while the next segment was being created (after the last one
    // was cut to its records, which comes first).
    let last = segs.last().unwrap();
    let bytes = fs::read(last).unwrap();
    fs::write(last, &bytes[..*record_ends(&bytes).last().unwrap()]).unwrap();
    let torn = d.0.join(format!("{next:020}.wal"));
    fs::write(&torn, [0u8; HEADER_LEN as usize]).unwrap();
    let (mut wal, recs) = Wal::open(&d.0, 200).unwrap();
    assert_eq!(recs.len(), 19);
    assert_eq!(wal.segment_paths().len(), segs.len() + 1);
    wal.append([(next, &b"after"[..])]).unwrap();
    drop(wal);
    let (_, recs) = Wal::open(&d.0, 200).unwrap();
    assert_eq!(recs.last().unwrap(), &(next, b"after".to_vec()));
}

#[test]
fn segments_are_preallocated_and_zeroed_ahead_of_their_records() {
    use std::os::unix::fs::MetadataExt;
    let d = TempDir::new("prealloc");
    let segment = 1 << 20;
    let wal = fill(&d.0, segment, &[1..4]);
    let path = &wal.segment_paths()[0];
    let meta = fs::metadata(path).unwrap();
    let written: u64 = HEADER_LEN
        + (1..4)
            .map(|i| super::RECORD_HEAD as u64 + 8 + payload(i).len() as u64)
            .sum::<u64>();
    assert_eq!(
        meta.len(),
        written + ZERO_AHEAD.min(segment - written),
        "the records, and room zeroed after them"
    );
    let bytes = fs::read(path).unwrap();
    assert!(bytes[written as usize..].iter().all(|&b| b == 0));
    // Where the filesystem can preallocate (not every one can), the whole
    // segment's blocks are reserved.
    if meta.blocks() * 512 < segment {
        eprintln!(
            "no preallocation on this filesystem ({} blocks)",
            meta.blocks()
        );
        return;
    }
    drop(wal);
    // Reopened: the records read back, and appends continue.
    let (mut wal, recs) = Wal::open(&d.0, segment).unwrap();
    assert_eq!(indexes(&recs), vec![1, 2, 3]);
    wal.append([(4, &b"four"[..])]).unwrap();
    let (_, recs) = Wal::open(&d.0, segment).unwrap();
    assert_eq!(indexes(&recs), vec![1, 2, 3, 4]);
}

/// The room zeroed ahead of the records is the end of the log, not damage:
/// reopening keeps it (no cut), appends overwrite it, and a batch that
/// reaches past it zeroes more.
#[test]
fn the_zeroed_room_ends_the_log_and_is_written_over() {
    let d = TempDir::new("zeroed");
    let segment = 8 << 20;
    let wal = fill(&d.0, segment, &[1..4]);
    let path = wal.segment_paths()[0].clone();
    drop(wal);
    let before = fs::metadata(&path).unwrap().len();
    let (mut wal, recs) = Wal::open(&d.0, segment).unwrap();
    assert_eq!(indexes(&recs), vec![1, 2, 3]);
    assert_eq!(fs::metadata(&path).unwrap().len(), before, "not cut");
    // A batch larger than the room zeroed ahead.
    let big = vec![7u8; ZERO_AHEAD as usize + 1000];
    wal.append([(4, &b"four"[..]), (5, &big[..])]).unwrap();
    let after = fs::metadata(&path).unwrap().len();
    let ends = record_ends(&fs::read(&path).unwrap());
    assert_eq!(ends.len(), 5);
    assert_eq!(after, *ends.last().unwrap() as u64 + ZERO_AHEAD);
    drop(wal);
    let (_, recs) = Wal::open(&d.0, segment).unwrap();
    assert_eq!(indexes(&recs), vec![1, 2, 3, 4, 5]);
    assert_eq!(recs[4].1, big);
}

/// A write torn inside the zeroed room (some bytes of a record, then
/// zeros) is cut off like any torn tail.
#[test]
fn a_torn_write_in_the_zeroed_room_is_cut() {
    let d = TempDir::new("zeroed-torn");
    let wal = fill(&d.0, 1 << 20, &[1..4]);
    let path = wal.segment_paths()[0].clone();
    drop(wal);
    let mut bytes = fs::read(&path).unwrap();
    let end = *record_ends(&bytes).last().unwrap();
    // Half of a record's head: a length, no checksum, no body.
    bytes[end..end + 4].copy_from_slice(&40u32.to_le_bytes());
    fs::write(&path, &bytes).unwrap();
    let (mut wal, recs) = Wal::open(&d.0, 1 << 20).unwrap();
    assert_eq!(indexes(&recs), vec![1, 2, 3]);
    assert_eq!(fs::metadata(&path).unwrap().len() as usize, end, "cut");
    wal.append([(4, &b"four"[..])]).unwrap();
    drop(wal);
    let (_, recs) = Wal::open(&d.0, 1 << 20).unwrap();
    assert_eq!(indexes(&recs), vec![1, 2, 3, 4]);
}

/// A segment is cut to its records, and synced, before the next one is
/// created: zeros after the records of an earlier segment are damage.
#[test]
fn an_earlier_segment_is_cut_to_its_records() {
    let d = TempDir::new("zeroed-roll");
    let wal = fill(&d.0, 2048, &[1..40, 40..80, 80..120]);
    let segs = wal.segment_paths();
    assert!(segs.len() > 2, "{} segments", segs.len());
    drop(wal);
    for seg in &segs[..segs.len() - 1] {
        let bytes = fs::read(seg).unwrap();
        assert_eq!(
            *record_ends(&bytes).last().unwrap(),
            bytes.len(),
            "{} ends with its records",
            seg.display()
        );
    }
    let (_, recs) = Wal::open(&d.0, 2048).unwrap();
    assert_eq!(indexes(&recs), (1..120).collect::<Vec<_>>());
    // Its last records zeroed (lost writes, damaged media): an error, not
    // a shorter log.
    let mut first = fs::read(&segs[0]).unwrap();
    let ends = record_ends(&first);
    let from = ends[ends.len() - 3];
    first[from..].fill(0);
    fs::write(&segs[0], &first).unwrap();
    assert!(matches!(
        Wal::open(&d.0, 2048),
        Err(WalError::Corrupt { .. })
    ));
}
