#!/usr/bin/env bash
# THE test command: installs and starts the test servers, runs fmt, clippy and the tests.
# Extra arguments go to `cargo test` (e.g. scripts/test.sh -p locksmith-redis -- --nocapture).
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

phase install bash scripts/install-servers.sh
phase fmt cargo fmt --all --check
phase clippy cargo clippy --workspace --all-targets --all-features -- -D warnings

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
  # --no-fail-fast: a failure in one test binary does not hide the results of the others.
  cargo test --workspace --all-features --no-fail-fast "$@" 2>&1 | tee "$TEST_LOG"
}
phase test run_tests "$@"
