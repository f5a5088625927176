#!/usr/bin/env bash
# Fuzzing Idem's parsers and state machine with cargo-fuzz, on stable Rust
# (no sanitizer: `-s none`; a panic is what the targets catch).
#
#   scripts/fuzz.sh build              build every target
#   scripts/fuzz.sh smoke [SECONDS]    run each target SECONDS (default 60)
#   scripts/fuzz.sh run TARGET [ARGS]  fuzz one target (libFuzzer ARGS, e.g.
#                                      -runs=10000000 or -max_total_time=600)
#
# Targets: frames, commands, store_apply, snapshot, wal_segment,
# peer_frames. New inputs go to a scratch corpus ($IDEM_FUZZ_WORK, default
# /tmp/idem-fuzz); the seeds in fuzz/corpus/<target> are read, not written.
# A crash is written to fuzz/artifacts/<target>/: fix it, then copy it
# into fuzz/corpus/<target>/ so it stays fixed (the server's unit tests run
# every file of the corpus through its target).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
TARGETS="frames commands store_apply snapshot wal_segment peer_frames"
WORK="${IDEM_FUZZ_WORK:-/tmp/idem-fuzz}"

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz" >&2
  cargo install --locked cargo-fuzz
fi

run() {
  local t="$1"; shift
  mkdir -p "$WORK/$t" "corpus/$t"
  cargo fuzz run -s none -O "$t" "$WORK/$t" "corpus/$t" -- -print_final_stats=1 "$@"
}

case "${1:-smoke}" in
  build) cargo fuzz build -s none -O ;;
  smoke)
    secs="${2:-60}"
    cargo fuzz build -s none -O
    for t in $TARGETS; do
      echo "== $t ($secs s)" >&2
      run "$t" -max_total_time="$secs"
    done ;;
  run) shift; t="$1"; shift; run "$t" "$@" ;;
  *) sed -n '2,17p' "$0"; exit 2 ;;
esac
