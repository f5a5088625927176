//! Fuzz target: see `idem_server::fuzzing::peer_frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idem_server::fuzzing::peer_frames(data));
