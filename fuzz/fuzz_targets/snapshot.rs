//! Fuzz target: see `idem_server::fuzzing::snapshot`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idem_server::fuzzing::snapshot(data));
