//! Fuzz target: see `idem_server::fuzzing::store_steps`; the steps are
//! structured input (`arbitrary`).
#![no_main]

use arbitrary::Arbitrary;
use idem_server::fuzzing::{Step, store_steps};

#[derive(Debug, Arbitrary)]
struct FuzzStep {
    kind: u8,
    key: u8,
    fence_back: u8,
    ms: u16,
    advance_ms: u16,
    data: Vec<u8>,
}

libfuzzer_sys::fuzz_target!(|steps: Vec<FuzzStep>| {
    let steps: Vec<Step> = steps
        .into_iter()
        .take(200)
        .map(|s| Step {
            kind: s.kind,
            key: s.key,
            fence_back: s.fence_back,
            ms: s.ms,
            advance_ms: s.advance_ms,
            data: s.data,
        })
        .collect();
    store_steps(&steps);
});
