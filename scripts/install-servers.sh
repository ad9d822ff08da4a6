#!/usr/bin/env bash
# Install the Debian packages the test run needs (servers, clients, protoc).
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
  [protobuf-compiler]=/usr/bin/protoc
  [openssl]=/usr/bin/openssl
  [curl]=/usr/bin/curl
  [netcat-openbsd]=/usr/bin/nc.openbsd
  [iproute2]=/usr/bin/ss
  [procps]=/usr/bin/pgrep
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

echo "install-servers: installing: ${missing[*]}"
start=$SECONDS
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
  "${missing[@]}" >/tmp/install-servers.apt.log 2>&1 || {
    echo "install-servers: apt-get install failed; last lines:" >&2
    tail -n 40 /tmp/install-servers.apt.log >&2
    exit 1
  }

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
