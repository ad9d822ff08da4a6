#!/usr/bin/env bash
# Install the Debian packages the test run needs (servers and their clients). Building needs
# nothing but Rust: no protoc (lock-etcd's gRPC code is checked in, vendor/etcd-client/README.md).
# Idempotent: does nothing (not even `apt-get update`) when everything is present.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive

# package -> a file that the package provides (checked with -x / -e).
declare -A PROVIDES=(
  [redis-server]=/usr/bin/redis-server
  [redis-tools]=/usr/bin/redis-cli
  [postgresql]=/usr/lib/postgresql/15/bin/postgres
  [postgresql-client]=/usr/lib/postgresql/15/bin/psql
  [mariadb-server]=/usr/sbin/mariadbd
  [mariadb-client]=/usr/bin/mariadb
  [zookeeper]=/usr/share/java/zookeeper.jar
  [etcd-server]=/usr/bin/etcd
  [etcd-client]=/usr/bin/etcdctl
  [openssl]=/usr/bin/openssl
  [curl]=/usr/bin/curl
  [netcat-openbsd]=/usr/bin/nc.openbsd
  [iproute2]=/usr/bin/ss # servers.sh finds leftovers by port with ss
  # libfaketime: the report's skewed-clock scenario runs a holder process whose clock is ahead.
  [faketime]=/usr/bin/faketime
  # The redis-py peer of lock-redis's interop tests (redis-py 4.3.4 on bookworm), run with
  # /usr/bin/python3; it also runs Redisson's scripts (Redisson itself is on Maven only).
  [python3-redis]=/usr/lib/python3/dist-packages/redis/lock.py
  # The interop tests' peers (lock-zk/tests/interop.rs, lock-etcd/tests/interop.rs): Curator
  # (a Java peer compiled at test time), kazoo; etcdctl above. Test-time only: building the
  # crates still needs nothing but Rust.
  [libcurator-recipes-java]=/usr/share/java/curator-recipes.jar
  [libcurator-framework-java]=/usr/share/java/curator-framework.jar
  [libcurator-client-java]=/usr/share/java/curator-client.jar
  [default-jdk-headless]=/usr/bin/javac
  [python3-kazoo]=/usr/lib/python3/dist-packages/kazoo/recipe/lock.py
  # go-zookeeper (a Go peer built at test time in GOPATH mode from Debian's sources).
  [golang-go]=/usr/bin/go
  [golang-github-samuel-go-zookeeper-dev]=/usr/share/gocode/src/github.com/samuel/go-zookeeper/zk/lock.go
)
# Other files the scripts rely on, with the package that brings them.
declare -A EXTRA=(
  [/usr/bin/mariadb-install-db]=mariadb-server
  [/usr/lib/postgresql/15/bin/initdb]=postgresql
  [/usr/bin/java]=zookeeper
)

missing=()
for pkg in "${!PROVIDES[@]}"; do
  [[ -e "${PROVIDES[$pkg]}" ]] || missing+=("$pkg")
done
for f in "${!EXTRA[@]}"; do
  if [[ ! -e "$f" ]]; then
    pkg="${EXTRA[$f]}"
    [[ " ${missing[*]-} " == *" $pkg "* ]] || missing+=("$pkg")
  fi
done
# ZooKeeper needs an slf4j binding or API jar on the classpath.
if ! compgen -G '/usr/share/java/slf4j-api*.jar' >/dev/null; then
  [[ " ${missing[*]-} " == *" zookeeper "* ]] || missing+=(zookeeper)
fi

if ((${#missing[@]} == 0)); then
  echo "install-servers: all packages present"
  exit 0
fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  SUDO=(sudo -n)
fi

APT_LOG=${TMPDIR:-/tmp}/install-servers.apt.log
APT_OPTS=(-o DPkg::Lock::Timeout=300 -o Acquire::Retries=3)

# retry TRIES CMD...: transient mirror/lock errors should not fail the test run.
retry() {
  local tries=$1 i
  shift
  for ((i = 1; i <= tries; i++)); do
    "$@" >>"$APT_LOG" 2>&1 && return 0
    echo "install-servers: attempt $i/$tries failed: $*" >&2
    ((i < tries)) && sleep 5
  done
  echo "install-servers: giving up; last lines of $APT_LOG:" >&2
  tail -n 40 "$APT_LOG" >&2
  return 1
}

echo "install-servers: installing: ${missing[*]}"
start=$SECONDS
: >"$APT_LOG"
retry 3 "${SUDO[@]}" apt-get "${APT_OPTS[@]}" update -qq
retry 3 "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${APT_OPTS[@]}" install -y -qq \
  --no-install-recommends \
  -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
  "${missing[@]}"

# Verify.
bad=0
for pkg in "${!PROVIDES[@]}"; do
  if [[ ! -e "${PROVIDES[$pkg]}" ]]; then
    echo "install-servers: $pkg installed but ${PROVIDES[$pkg]} is missing" >&2
    bad=1
  fi
done
for f in "${!EXTRA[@]}"; do
  [[ -e "$f" ]] || { echo "install-servers: $f is missing" >&2; bad=1; }
done
((bad == 0)) || exit 1
echo "install-servers: done in $((SECONDS - start)) s"
