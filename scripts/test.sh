#!/usr/bin/env bash
# THE test command: installs and starts the test servers, runs fmt, clippy and the tests.
# Extra arguments go to `cargo test` (e.g. scripts/test.sh -p lock-redis -- --nocapture), through
# scripts/run-tests.sh (LOCKSMITH_TEST_JOBS test binaries at once, default 4).
#
# LOCKSMITH_REUSE_SERVERS=1: when `scripts/servers.sh status` says every server answers,
# use the running ones and leave them running (handy while developing; CI never sets it).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v cargo >/dev/null 2>&1 && [[ -f $HOME/.cargo/env ]]; then
  # shellcheck disable=SC1091
  source "$HOME/.cargo/env"
fi

now_us() { echo "${EPOCHREALTIME//[!0-9]/}"; }
secs() { printf '%d.%01d' $(($1 / 1000000)) $((($1 % 1000000) / 100000)); }

T_START=$(now_us)
PHASES=()
TEST_LOG=''
STOP_SERVERS=0

# phase NAME CMD... : run CMD, record its wall time (also when it fails).
phase() {
  local name=$1 t0 rc=0
  shift
  echo "==> $name: $*"
  t0=$(now_us)
  "$@" || rc=$?
  PHASES+=("$(printf '%-8s %7ss%s' "$name" "$(secs $(($(now_us) - t0)))" "$([[ $rc == 0 ]] || echo "  (FAILED, exit $rc)")")")
  return "$rc"
}

finish() {
  local rc=$?
  if ((STOP_SERVERS)); then
    scripts/servers.sh stop || true
  fi
  echo
  echo "==> wall time per phase"
  local p
  for p in "${PHASES[@]}"; do echo "    $p"; done
  printf '    %-8s %7ss\n' total "$(secs $(($(now_us) - T_START)))"
  if ((rc == 0)); then echo "==> OK"; else echo "==> FAILED (exit $rc)"; fi
  if [[ -n $TEST_LOG && -f $TEST_LOG ]]; then
    # One plain closing line summing every `test result:` line cargo printed.
    sed 's/\x1b\[[0-9;]*m//g' "$TEST_LOG" | awk '
      /^test result: / {
        for (i = 1; i <= NF; i++) {
          if ($(i) ~ /^passed;?$/) p += $(i - 1)
          if ($(i) ~ /^failed;?$/) f += $(i - 1)
          if ($(i) ~ /^ignored;?$/) s += $(i - 1)
        }
      }
      END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }'
    rm -f "$TEST_LOG"
  fi
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# without_protoc CMD...: run CMD where `protoc` cannot run and Google's .proto files cannot be
# found, so that every build below shows the workspace builds with nothing but Rust (issue: the
# etcd client's upstream build script needed protoc). A private mount namespace hides them from
# CMD alone; it needs root (CI runs as root). Elsewhere CMD runs as it is, and says so.
without_protoc() {
  if [[ $(id -u) == 0 ]] && command -v unshare >/dev/null 2>&1; then
    unshare --mount --propagation private -- bash -c '
      set -e
      for p in $(type -ap protoc) /usr/bin/protoc /usr/local/bin/protoc; do
        if [[ -f $p ]]; then mount --bind /dev/null "$p"; fi
      done
      if [[ -d /usr/include/google/protobuf ]]; then mount -t tmpfs none /usr/include/google/protobuf; fi
      unset PROTOC PROTOC_INCLUDE
      if protoc --version >/dev/null 2>&1; then echo "without_protoc: protoc still runs" >&2; exit 1; fi
      echo "==> (protoc hidden: a build that needs it fails)"
      exec "$@"' without_protoc "$@"
  else
    echo "==> (not root: protoc is not hidden for this run)"
    "$@"
  fi
}

# No build dependency of any crate may be a protobuf code generator (tests may use one).
no_protobuf_build_step() {
  local found
  found=$(cargo tree --workspace --all-features -e normal,build --prefix none \
    -i prost-build -i tonic-build -i tonic-prost-build 2>/dev/null || true)
  if [[ -n $found ]]; then
    echo "a crate builds protobuf code at build time (needs protoc):" >&2
    echo "$found" >&2
    return 1
  fi
  echo "no crate generates protobuf code at build time"
}

# The build and the tests' throw-away data take about 5 GB: say so up front when the disk has
# less (a full disk fails the build with "No space left on device" minutes later).
free_gb=$(df -Pk . | awk 'NR == 2 { print int($4 / 1048576) }')
echo "==> disk: ${free_gb} GB free here"
if ((free_gb < 6)); then
  echo "==> WARNING: under 6 GB free; the build and the tests need about 5 GB" >&2
fi
phase install bash scripts/install-servers.sh
phase fmt cargo fmt --all --check
phase noprotoc no_protobuf_build_step
phase clippy without_protoc cargo clippy --workspace --all-targets --all-features -- -D warnings
# The API docs build without a warning (broken or private links, output collisions), every
# feature on, as docs.rs builds them.
phase doc without_protoc env RUSTDOCFLAGS='-D warnings' cargo doc --workspace --no-deps --all-features
# Every publishable crate packages (its manifest, its files, its dependencies publishable too;
# the vendored etcd client included). --no-verify: the verify step would build every crate
# again from its package, a second full build.
phase package without_protoc cargo package --workspace --no-verify --allow-dirty --quiet

if [[ ${LOCKSMITH_REUSE_SERVERS:-0} == 1 ]] && scripts/servers.sh status >/dev/null 2>&1; then
  echo "==> servers: reusing the running ones (LOCKSMITH_REUSE_SERVERS=1)"
else
  STOP_SERVERS=1
  phase servers scripts/servers.sh start
fi
env_lines=$(scripts/servers.sh env)
eval "$env_lines"
export LOCK_TEST_REQUIRE_ALL=1

TEST_LOG=$(mktemp /tmp/locksmith-test-log.XXXXXX)
run_tests() {
  # Every test binary, several side by side (most of their time is waiting), each to the end
  # (a failure in one does not hide the results of the others); prints where the time went.
  without_protoc bash scripts/run-tests.sh "$@" 2>&1 | tee "$TEST_LOG"
}
phase test run_tests "$@"

# The README's first command (the conformance report on the embedded backends) on the
# `locksmith` binary the test build made where protoc could not be found (the README's
# `cargo run --release` builds the same code with optimisations; `cargo run -p` here would
# rebuild dependencies with the CLI's own feature set). Exits 1 if a scenario fails.
first_command() {
  local out
  out=$(mktemp -d /tmp/locksmith-report.XXXXXX)
  "${CARGO_TARGET_DIR:-target}/debug/locksmith" report --out "$out"
  ls "$out"/report.json "$out"/report.md "$out"/report.html >/dev/null
  rm -rf "$out"
}
if [[ $# == 0 ]]; then
  phase report first_command
fi
