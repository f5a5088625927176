//! Fuzz target: see `idem_server::fuzzing::wal_segment` (a scratch
//! directory per process, in /dev/shm when there is one).
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        base.join(format!("idem-fuzz-wal-{}", std::process::id()))
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| idem_server::fuzzing::wal_segment(scratch(), data));
