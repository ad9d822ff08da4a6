#!/usr/bin/env bash
# Private, throw-away server instances on 127.0.0.1 for the test run.
#
#   scripts/servers.sh start   # (re)start everything from scratch; kills leftovers first
#   scripts/servers.sh stop    # stop everything (also leftovers of a crashed run)
#   scripts/servers.sh env     # print `export LOCK_TEST_...=...` lines (eval them)
#   scripts/servers.sh status  # probe every server; exit 1 if any is not answering
#   scripts/servers.sh start-etcd-tls | stop-etcd-tls
#                              # only the TLS+auth etcd (for manual runs: override its ports with
#                              # LOCKSMITH_ETCD_TLS_PORT / LOCKSMITH_ETCD_TLS_PEER_PORT and the dir
#                              # with LOCKSMITH_SERVERS_DIR; touches nothing else)
#
# All state (data, logs, pidfiles, certificates) lives under $LOCKSMITH_SERVERS_DIR
# (default /tmp/locksmith-servers); the etcd data dir goes to /dev/shm when it is big enough.
# Only one set of these servers can run per machine (the ports are fixed).
#
# Ports: redis 16379 (plain), 16380-16384 (Redlock), 16385 (requirepass + ACL user),
#        16386 (TLS only), 17000-17002 (cluster; bus 27000-27002); postgres 15432;
#        mariadb 13306; zookeeper 12181 (plain) / 12182 (TLS, client certificate required);
#        etcd 12379 (client) / 12380 (peer);
#        etcd with TLS + auth 12383 (client) / 12384 (peer).
set -euo pipefail

DIR=${LOCKSMITH_SERVERS_DIR:-/tmp/locksmith-servers}
DIR=$(realpath -m -- "$DIR")
MARKER=.locksmith-servers

PGBIN=/usr/lib/postgresql/15/bin

REDIS_PORT=16379
REDLOCK_PORTS=(16380 16381 16382 16383 16384)
REDIS_AUTH_PORT=16385
REDIS_TLS_PORT=16386
CLUSTER_PORTS=(17000 17001 17002)
PG_PORT=15432
MY_PORT=13306
ZK_PORT=${LOCKSMITH_ZK_PORT:-12181}
ZK_TLS_PORT=${LOCKSMITH_ZK_TLS_PORT:-12182}
ETCD_PORT=12379
ETCD_PEER_PORT=12380
ETCD_TLS_PORT=${LOCKSMITH_ETCD_TLS_PORT:-12383}
ETCD_TLS_PEER_PORT=${LOCKSMITH_ETCD_TLS_PEER_PORT:-12384}

# Credentials (test-only).
REDIS_REQUIREPASS='r3dis-auth-pw'      # password of the `default` user on 16385
REDIS_ACL_USER='locksmith'
REDIS_ACL_PASS='s3cret:p@ss/w0rd'      # needs URL-encoding: s3cret%3Ap%40ss%2Fw0rd
DB_USER='locksmith'
DB_PASS='locksmith-pw'
DB_NAME='locksmith'
# A MariaDB user without CREATE ROUTINE or EXECUTE: the lease strategy's shares without the
# share procedures (lock-sql's statement path).
DB_PLAIN_USER='locksmith_plain'
DB_PLAIN_PASS='locksmith-plain-pw'
ETCD_ROOT_PASS='etcd-r00t-pw'
ETCD_USER='locksmith'
ETCD_PASS='etcd:p@ss/w0rd'             # needs URL-encoding
ETCD_PREFIX='locksmith/'               # the user's role may read and write only under it

# Seconds each readiness wait may take before the start fails.
T_REDIS=20
T_CLUSTER=40
T_PG=40
T_MY=60
T_ZK=60
T_ETCD=30

ALL_PORTS=("$REDIS_PORT" "${REDLOCK_PORTS[@]}" "$REDIS_AUTH_PORT" "$REDIS_TLS_PORT"
  "${CLUSTER_PORTS[@]}" 27000 27001 27002 "$PG_PORT" "$MY_PORT" "$ZK_PORT" "$ZK_TLS_PORT"
  "$ETCD_PORT" "$ETCD_PEER_PORT" "$ETCD_TLS_PORT" "$ETCD_TLS_PEER_PORT")
# Process names we are allowed to kill when they hold one of our ports.
OUR_COMMS='^(redis-server|redis-check-rdb|postgres|mariadbd|mysqld|java|etcd)$'

# ---------------------------------------------------------------------------- helpers

log() { printf '[servers %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}
now_us() { echo "${EPOCHREALTIME//[!0-9]/}"; }
# elapsed START_US -> "1.23"
elapsed() {
  local d=$(($(now_us) - $1))
  printf '%d.%02d' $((d / 1000000)) $(((d % 1000000) / 10000))
}

tail_log() {
  local f
  for f in "$@"; do
    if [[ -s $f ]]; then
      log "---- last 40 lines of $f ----"
      tail -n 40 -- "$f" >&2 || true
      log "---- end of $f ----"
    fi
  done
}

# alive PID: running and not a zombie
alive() {
  local pid=$1 state
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ $state != Z ]]
}

comm_of() { cat "/proc/$1/comm" 2>/dev/null || true; }

# ours PID: one of our server programs (a java only if it is a ZooKeeper server).
ours() {
  local comm
  comm=$(comm_of "$1")
  [[ $comm =~ $OUR_COMMS ]] || return 1
  [[ $comm != java ]] || [[ $(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null) == *QuorumPeerMain* ]]
}

# wait_for TIMEOUT DESCRIPTION "LOGFILES" PID CMD... : poll CMD every 0.1 s.
# Fails loudly (with the logs' tails) on timeout or when PID (if given) dies.
wait_for() {
  local timeout=$1 desc=$2 logs=$3 pid=$4
  shift 4
  local t0 deadline
  t0=$(now_us)
  deadline=$((t0 + timeout * 1000000))
  until "$@" >/dev/null 2>&1; do
    if [[ -n $pid ]] && ! alive "$pid"; then
      log "FAILED: $desc: process $pid exited"
      # shellcheck disable=SC2086
      tail_log $logs
      return 1
    fi
    if (($(now_us) > deadline)); then
      log "FAILED: $desc: not ready after ${timeout}s"
      # shellcheck disable=SC2086
      tail_log $logs
      return 1
    fi
    sleep 0.1
  done
}

urlencode() {
  local s=$1 out='' c i
  for ((i = 0; i < ${#s}; i++)); do
    c=${s:i:1}
    case $c in
      [A-Za-z0-9._~-]) out+=$c ;;
      *) out+=$(printf '%%%02X' "'$c") ;;
    esac
  done
  printf '%s' "$out"
}

need() {
  local f
  for f in "$@"; do
    [[ -x $f ]] || command -v "$f" >/dev/null 2>&1 ||
      die "$f not found: run scripts/install-servers.sh first"
  done
}

# Run as the postgres user (PostgreSQL refuses root), from a directory it can enter.
as_pg() {
  if ((EUID == 0)); then
    (cd "$DIR/postgres" && runuser -u postgres -- "$@")
  else
    (cd "$DIR/postgres" && "$@")
  fi
}

# PIDs listening on any of our ports (needs ss from iproute2).
port_pids() {
  command -v ss >/dev/null 2>&1 || return 0
  local filter='' p
  for p in "${ALL_PORTS[@]}"; do
    filter+="${filter:+ or }sport = :$p"
  done
  ss -Hltnp "( $filter )" 2>/dev/null | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u || true
}

port_listeners() {
  command -v ss >/dev/null 2>&1 || return 0
  local filter='' p
  for p in "${ALL_PORTS[@]}"; do
    filter+="${filter:+ or }sport = :$p"
  done
  ss -Hltnp "( $filter )" 2>/dev/null || true
}

etcd_data_dir() { # [suffix]
  local shm_mb
  if [[ -d /dev/shm && -w /dev/shm ]]; then
    shm_mb=$(df -Pm /dev/shm 2>/dev/null | awk 'NR==2 {print $4}')
    if [[ ${shm_mb:-0} -ge 512 ]]; then
      echo "/dev/shm/locksmith-etcd${1:-}-$(printf '%s' "$DIR" | cksum | cut -d' ' -f1)"
      return
    fi
  fi
  echo "$DIR/etcd${1:-}/data"
}

# ---------------------------------------------------------------------------- stop

stop_all() {
  local t0 pids=() pid f comm
  t0=$(now_us)

  # PostgreSQL: immediate shutdown through pg_ctl when its data dir is there.
  if [[ -f $DIR/postgres/data/postmaster.pid ]] && [[ -x $PGBIN/pg_ctl ]]; then
    as_pg timeout 15 "$PGBIN/pg_ctl" -D "$DIR/postgres/data" stop -m immediate -w -t 10 \
      >/dev/null 2>&1 || true
  fi

  # Everything recorded in a pidfile...
  for f in "$DIR"/redis/*/redis.pid "$DIR"/mariadb/mariadbd.pid "$DIR"/mariadb/mariadb.pid \
    "$DIR"/zk/zk.pid "$DIR"/etcd/etcd.pid "$DIR"/etcd-tls/etcd.pid "$DIR"/postgres/data/postmaster.pid; do
    [[ -f $f ]] || continue
    pid=$(head -n1 "$f" 2>/dev/null | tr -dc 0-9)
    if alive "$pid" && ours "$pid"; then
      pids+=("$pid")
    fi
  done
  # ...and whatever of ours still listens on our ports (leftovers of a run whose dir is gone).
  for pid in $(port_pids); do
    if ours "$pid"; then
      pids+=("$pid")
    else
      comm=$(comm_of "$pid")
      log "WARNING: pid $pid ($comm) listens on one of our ports; not ours, not killing it"
    fi
  done

  if ((${#pids[@]})); then
    mapfile -t pids < <(printf '%s\n' "${pids[@]}" | sort -u)
    # SIGCONT too: a test may have SIGSTOPped a server.
    kill -TERM "${pids[@]}" 2>/dev/null || true
    kill -CONT "${pids[@]}" 2>/dev/null || true
    local deadline=$(($(now_us) + 3000000)) left
    while :; do
      left=()
      for pid in "${pids[@]}"; do alive "$pid" && left+=("$pid"); done
      ((${#left[@]})) || break
      if (($(now_us) > deadline)); then
        log "SIGKILL to ${left[*]} (no exit 3 s after SIGTERM)"
        kill -KILL "${left[@]}" 2>/dev/null || true
        sleep 0.2
        break
      fi
      sleep 0.05
    done
    for pid in "${pids[@]}"; do
      alive "$pid" && log "WARNING: pid $pid still alive after SIGKILL"
    done
  fi

  # etcd's tmpfs data dirs.
  for f in "$DIR/etcd/datadir" "$DIR/etcd-tls/datadir"; do
    [[ -f $f ]] || continue
    f=$(cat "$f")
    [[ $f == /dev/shm/locksmith-etcd-* || $f == "$DIR"/* ]] && rm -rf -- "$f"
  done
  rm -f "$DIR"/redis/*/redis.pid "$DIR"/mariadb/*.pid "$DIR"/zk/zk.pid "$DIR"/etcd/etcd.pid \
    "$DIR"/etcd-tls/etcd.pid

  if [[ -n $(port_pids) ]]; then
    log "WARNING: still listening on our ports:"
    port_listeners >&2
    return 1
  fi
  log "stopped (${#pids[@]} processes) in $(elapsed "$t0") s"
}

# ---------------------------------------------------------------------------- certificates

gen_certs() {
  local t=$DIR/tls
  mkdir -p "$t"
  cat >"$t/openssl.cnf" <<'EOF'
[req]
distinguished_name = dn
prompt = no
[dn]
CN = locksmith-test
[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[v3_server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth,clientAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid,issuer
EOF
  (
    cd "$t"
    openssl req -x509 -config openssl.cnf -extensions v3_ca -newkey ec \
      -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out ca.pem \
      -days 3650 -subj '/CN=locksmith test CA'
    openssl req -new -config openssl.cnf -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
      -nodes -keyout server.key -out server.csr -subj '/CN=localhost'
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key \
      -set_serial "0x$(openssl rand -hex 8)" -days 825 -sha256 \
      -extfile openssl.cnf -extensions v3_server -out server.pem
    chmod 600 ca.key server.key
  ) >"$t/gen.log" 2>&1 || {
    tail_log "$t/gen.log"
    die "certificate generation failed"
  }
}

# ---------------------------------------------------------------------------- redis

redis_conf() { # PORT [extra config lines...]
  local port=$1 d=$DIR/redis/$1
  shift
  mkdir -p "$d"
  {
    if [[ $port != "$REDIS_TLS_PORT" ]]; then echo "port $port"; fi
    echo 'bind 127.0.0.1'
    echo 'daemonize yes'
    echo "pidfile \"$d/redis.pid\""
    echo "logfile \"$d/redis.log\""
    echo "dir \"$d\""
    echo 'save ""'
    echo 'appendonly no'
    echo 'enable-debug-command local'
    printf '%s\n' "$@"
  } >"$d/redis.conf"
}

redis_ping() { # PORT [redis-cli args...]
  local port=$1
  shift
  [[ $(timeout 3 redis-cli --no-auth-warning -h 127.0.0.1 -p "$port" "$@" ping 2>/dev/null) == PONG ]]
}

cluster_ok() {
  local p
  for p in "${CLUSTER_PORTS[@]}"; do
    [[ $(timeout 3 redis-cli -h 127.0.0.1 -p "$p" cluster info 2>/dev/null) == *cluster_state:ok* ]] || return 1
  done
}

start_redis() {
  local t0 p
  t0=$(now_us)
  for p in "$REDIS_PORT" "${REDLOCK_PORTS[@]}"; do redis_conf "$p"; done
  redis_conf "$REDIS_AUTH_PORT" \
    "requirepass \"$REDIS_REQUIREPASS\"" \
    "user $REDIS_ACL_USER on \">$REDIS_ACL_PASS\" ~* &* +@all"
  redis_conf "$REDIS_TLS_PORT" \
    'port 0' \
    "tls-port $REDIS_TLS_PORT" \
    "tls-cert-file \"$DIR/tls/server.pem\"" \
    "tls-key-file \"$DIR/tls/server.key\"" \
    "tls-ca-cert-file \"$DIR/tls/ca.pem\"" \
    'tls-auth-clients no'
  for p in "${CLUSTER_PORTS[@]}"; do
    redis_conf "$p" 'cluster-enabled yes' \
      "cluster-config-file \"$DIR/redis/$p/nodes.conf\"" \
      'cluster-node-timeout 5000'
  done

  for p in "$REDIS_PORT" "${REDLOCK_PORTS[@]}" "$REDIS_AUTH_PORT" "$REDIS_TLS_PORT" "${CLUSTER_PORTS[@]}"; do
    redis-server "$DIR/redis/$p/redis.conf" </dev/null >>"$DIR/redis/$p/redis.log" 2>&1 ||
      {
        tail_log "$DIR/redis/$p/redis.log"
        die "redis-server on $p failed to start"
      }
  done
  for p in "$REDIS_PORT" "${REDLOCK_PORTS[@]}" "${CLUSTER_PORTS[@]}"; do
    wait_for "$T_REDIS" "redis $p" "$DIR/redis/$p/redis.log" "" redis_ping "$p"
  done
  wait_for "$T_REDIS" "redis $REDIS_AUTH_PORT (requirepass)" "$DIR/redis/$REDIS_AUTH_PORT/redis.log" "" \
    redis_ping "$REDIS_AUTH_PORT" -a "$REDIS_REQUIREPASS"
  wait_for "$T_REDIS" "redis $REDIS_AUTH_PORT (ACL user)" "$DIR/redis/$REDIS_AUTH_PORT/redis.log" "" \
    redis_ping "$REDIS_AUTH_PORT" --user "$REDIS_ACL_USER" --pass "$REDIS_ACL_PASS"
  wait_for "$T_REDIS" "redis $REDIS_TLS_PORT (TLS)" "$DIR/redis/$REDIS_TLS_PORT/redis.log" "" \
    redis_ping "$REDIS_TLS_PORT" --tls --cacert "$DIR/tls/ca.pem"
  log "redis: 10 instances up in $(elapsed "$t0") s; creating cluster"

  local args=()
  for p in "${CLUSTER_PORTS[@]}"; do args+=("127.0.0.1:$p"); done
  if ! timeout "$T_CLUSTER" redis-cli --cluster create "${args[@]}" --cluster-replicas 0 --cluster-yes \
    </dev/null >"$DIR/redis/cluster-create.log" 2>&1; then
    tail_log "$DIR/redis/cluster-create.log" "$DIR/redis/${CLUSTER_PORTS[0]}/redis.log"
    die "redis --cluster create failed"
  fi
  local logs=''
  for p in "${CLUSTER_PORTS[@]}"; do logs+=" $DIR/redis/$p/redis.log"; done
  wait_for "$T_CLUSTER" "redis cluster_state:ok" "$DIR/redis/cluster-create.log$logs" "" cluster_ok
  log "redis: ready (incl. cluster) in $(elapsed "$t0") s"
}

# ---------------------------------------------------------------------------- postgres

pg_tcp_ok() {
  [[ $(PGCONNECT_TIMEOUT=3 timeout 5 "$PGBIN/psql" -X -q -t -A \
    "postgres://$DB_USER:$DB_PASS@127.0.0.1:$PG_PORT/$DB_NAME?sslmode=require" -c 'select 1') == 1 ]]
}

start_postgres() {
  local t0 d=$DIR/postgres
  t0=$(now_us)
  mkdir -p "$d/sock"
  if ((EUID == 0)); then
    chown -R postgres:postgres "$d"
    runuser -u postgres -- test -x "$d" ||
      die "user postgres cannot enter $d (LOCKSMITH_SERVERS_DIR must be outside /root)"
  fi
  as_pg "$PGBIN/initdb" -D "$d/data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
    --no-locale -E UTF8 --no-sync --no-instructions >"$d/initdb.log" 2>&1 || {
    tail_log "$d/initdb.log"
    die "initdb failed"
  }
  cat >"$d/data/pg_hba.conf" <<EOF
local all all trust
host  all all 127.0.0.1/32 scram-sha-256
EOF
  cat >>"$d/data/postgresql.conf" <<EOF

# ---- locksmith test instance ----
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$d/sock'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
password_encryption = 'scram-sha-256'
ssl = on
ssl_cert_file = 'server.crt'
ssl_key_file = 'server.key'
EOF
  cp "$DIR/tls/server.pem" "$d/data/server.crt"
  cp "$DIR/tls/server.key" "$d/data/server.key"
  chmod 600 "$d/data/server.key"
  if ((EUID == 0)); then chown postgres:postgres "$d/data/server.crt" "$d/data/server.key" "$d/data/pg_hba.conf"; fi

  if ! as_pg "$PGBIN/pg_ctl" -D "$d/data" -l "$d/postgres.log" -w -t "$T_PG" start >"$d/pg_ctl.log" 2>&1; then
    tail_log "$d/pg_ctl.log" "$d/postgres.log"
    die "postgres failed to start"
  fi
  as_pg "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$d/sock" -p "$PG_PORT" -U postgres -d postgres \
    -c "CREATE ROLE $DB_USER LOGIN CREATEDB PASSWORD '$DB_PASS'" \
    -c "GRANT pg_signal_backend TO $DB_USER" \
    -c "CREATE DATABASE $DB_NAME OWNER $DB_USER" >"$d/setup.log" 2>&1 || {
    tail_log "$d/setup.log" "$d/postgres.log"
    die "postgres role/database setup failed"
  }
  wait_for "$T_PG" "postgres TCP+TLS login" "$d/postgres.log" "" pg_tcp_ok
  log "postgres: ready in $(elapsed "$t0") s"
}

# ---------------------------------------------------------------------------- mariadb

my_sock_ping() {
  timeout 5 mariadb-admin --no-defaults --socket="$DIR/mariadb/mariadb.sock" -uroot \
    --connect-timeout=2 ping
}
my_tcp_ok() {
  [[ $(timeout 5 mariadb --no-defaults -h127.0.0.1 -P"$MY_PORT" -u"$DB_USER" -p"$DB_PASS" \
    --connect-timeout=2 -N -B "$DB_NAME" -e 'select 1') == 1 ]]
}

start_mariadb() {
  local t0 d=$DIR/mariadb pid
  t0=$(now_us)
  mkdir -p "$d/data" "$d/tmp"
  local as_root=()
  ((EUID == 0)) && as_root=(--user=root)
  mariadb-install-db --no-defaults --datadir="$d/data" "${as_root[@]}" \
    --auth-root-authentication-method=socket --skip-test-db --skip-name-resolve \
    --innodb-log-file-size=16M >"$d/install-db.log" 2>&1 || {
    tail_log "$d/install-db.log"
    die "mariadb-install-db failed"
  }
  setsid mariadbd --no-defaults "${as_root[@]}" \
    --datadir="$d/data" --tmpdir="$d/tmp" \
    --socket="$d/mariadb.sock" --pid-file="$d/mariadb.pid" \
    --port="$MY_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
    --log-error="$d/mariadb.log" \
    --max-connections=200 \
    --innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 --innodb-log-file-size=16M \
    --innodb-buffer-pool-size=128M \
    --ssl-ca="$DIR/tls/ca.pem" --ssl-cert="$DIR/tls/server.pem" --ssl-key="$DIR/tls/server.key" \
    </dev/null >>"$d/mariadb.out" 2>&1 &
  pid=$!
  echo "$pid" >"$d/mariadbd.pid"
  wait_for "$T_MY" "mariadb socket ping" "$d/mariadb.log $d/mariadb.out" "$pid" my_sock_ping
  timeout 20 mariadb --no-defaults --socket="$d/mariadb.sock" -uroot >"$d/setup.log" 2>&1 <<EOF || {
CREATE DATABASE $DB_NAME;
CREATE USER '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE USER '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL PRIVILEGES ON $DB_NAME.* TO '$DB_USER'@'127.0.0.1', '$DB_USER'@'localhost';
GRANT PROCESS, CONNECTION ADMIN ON *.* TO '$DB_USER'@'127.0.0.1', '$DB_USER'@'localhost';
CREATE USER '$DB_PLAIN_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PLAIN_PASS';
GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, INDEX ON $DB_NAME.* TO '$DB_PLAIN_USER'@'127.0.0.1';
EOF
    tail_log "$d/setup.log" "$d/mariadb.log"
    die "mariadb user/database setup failed"
  }
  wait_for "$T_MY" "mariadb TCP login" "$d/mariadb.log" "$pid" my_tcp_ok
  log "mariadb: ready in $(elapsed "$t0") s"
}

# ---------------------------------------------------------------------------- zookeeper

zk_classpath() {
  local cp=/usr/share/java/zookeeper.jar j
  [[ -f $cp ]] || die "$cp missing: run scripts/install-servers.sh"
  # zookeeper.jar's manifest Class-Path pulls in its dependencies (slf4j-api included);
  # add one slf4j binding so the log is readable. The secure client port runs on Netty, whose
  # codec and resolver jars the manifest does not list.
  for j in /usr/share/java/netty-codec.jar /usr/share/java/netty-resolver.jar; do
    [[ -f $j ]] && cp+=":$j"
  done
  for j in /usr/share/java/slf4j-simple.jar /usr/share/java/slf4j-jdk14.jar /usr/share/java/slf4j-nop.jar; do
    if [[ -f $j ]]; then
      cp+=":$j"
      break
    fi
  done
  echo "$cp"
}

# Four-letter word through bash's /dev/tcp. (A plain `echo srvr | nc HOST PORT` with Debian's
# nc returns nothing ~3-6% of the time; `nc -q 1` or `nc -N` would be fine too.)
zk_4lw() {
  # shellcheck disable=SC2016 # expanded by the inner bash
  timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf %s "$2" >&3 && cat <&3' _ "$ZK_PORT" "$1" 2>/dev/null
}
zk_srvr() { [[ $(zk_4lw srvr) == *Mode:* ]]; }
# A TLS handshake on the secure client port that verifies the server and presents the client
# certificate (the port requires one).
zk_tls_ok() {
  timeout 5 openssl s_client -connect "127.0.0.1:$ZK_TLS_PORT" -CAfile "$DIR/tls/ca.pem" \
    -cert "$DIR/tls/server.pem" -key "$DIR/tls/server.key" -verify_return_error -brief \
    </dev/null >/dev/null 2>&1
}

start_zookeeper() {
  local t0 d=$DIR/zk pid cp
  t0=$(now_us)
  mkdir -p "$d/data"
  cp=$(zk_classpath)
  # The secure client port's key store: the gen_certs key and certificate in one PEM file.
  cat "$DIR/tls/server.key" "$DIR/tls/server.pem" >"$d/keystore.pem"
  chmod 600 "$d/keystore.pem"
  cat >"$d/zoo.cfg" <<EOF
tickTime=500
minSessionTimeout=1000
maxSessionTimeout=60000
initLimit=10
syncLimit=5
dataDir=$d/data
clientPort=$ZK_PORT
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=srvr,mntr,ruok,stat,cons
extendedTypesEnabled=true
secureClientPort=$ZK_TLS_PORT
secureClientPortAddress=127.0.0.1
ssl.keyStore.location=$d/keystore.pem
ssl.keyStore.type=PEM
ssl.trustStore.location=$DIR/tls/ca.pem
ssl.trustStore.type=PEM
ssl.clientAuth=need
EOF
  setsid java -Xmx256m -Xms64m -XX:+UseSerialGC -Djava.net.preferIPv4Stack=true \
    -Dzookeeper.admin.enableServer=false \
    -Dzookeeper.4lw.commands.whitelist=srvr,mntr,ruok,stat,cons \
    -Dzookeeper.extendedTypesEnabled=true \
    -Dzookeeper.serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory \
    -Dorg.slf4j.simpleLogger.showDateTime=true \
    -Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS \
    -cp "$cp" org.apache.zookeeper.server.quorum.QuorumPeerMain "$d/zoo.cfg" \
    </dev/null >"$d/zk.log" 2>&1 &
  pid=$!
  echo "$pid" >"$d/zk.pid"
  wait_for "$T_ZK" "zookeeper srvr Mode:" "$d/zk.log" "$pid" zk_srvr
  wait_for "$T_ZK" "zookeeper TLS $ZK_TLS_PORT" "$d/zk.log" "$pid" zk_tls_ok
  log "zookeeper: ready in $(elapsed "$t0") s (pid $pid)"
}

# ---------------------------------------------------------------------------- etcd

etcd_health() {
  [[ $(timeout 3 curl -fsS -m 2 "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null) == *'"health":"true"'* ]]
}

start_etcd() {
  local t0 d=$DIR/etcd pid data
  t0=$(now_us)
  mkdir -p "$d"
  data=$(etcd_data_dir)
  rm -rf -- "$data"
  echo "$data" >"$d/datadir"
  setsid etcd --name locksmith --data-dir "$data" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "locksmith=http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster-state new --initial-cluster-token "locksmith-test" \
    --heartbeat-interval 50 --election-timeout 500 \
    --logger zap --log-outputs stderr \
    </dev/null >"$d/etcd.log" 2>&1 &
  pid=$!
  echo "$pid" >"$d/etcd.pid"
  wait_for "$T_ETCD" "etcd /health" "$d/etcd.log" "$pid" etcd_health
  log "etcd: ready in $(elapsed "$t0") s (data in $data)"
}

etcd_tls_ctl() { # etcdctl against the TLS member, as root once auth is on
  timeout 10 etcdctl --endpoints "https://127.0.0.1:$ETCD_TLS_PORT" --cacert "$DIR/tls/ca.pem" \
    --dial-timeout 3s --command-timeout 5s "$@"
}
etcd_tls_health() {
  [[ $(timeout 3 curl -fsS -m 2 --cacert "$DIR/tls/ca.pem" \
    "https://127.0.0.1:$ETCD_TLS_PORT/health" 2>/dev/null) == *'"health":"true"'* ]]
}
# The locksmith user can read the key it is meant to write (auth + RBAC in place).
etcd_tls_auth_ok() {
  etcd_tls_ctl --user "$ETCD_USER:$ETCD_PASS" get "${ETCD_PREFIX}probe" &&
    ! etcd_tls_ctl get "${ETCD_PREFIX}probe"
}

# An etcd serving clients over TLS only (certificate from gen_certs) with auth enabled: a root
# user and a `locksmith` user whose role may read and write only under $ETCD_PREFIX.
start_etcd_tls() {
  local t0 d=$DIR/etcd-tls pid data
  t0=$(now_us)
  mkdir -p "$d"
  data=$(etcd_data_dir -tls)
  rm -rf -- "$data"
  echo "$data" >"$d/datadir"
  setsid etcd --name locksmith-tls --data-dir "$data" \
    --listen-client-urls "https://127.0.0.1:$ETCD_TLS_PORT" \
    --advertise-client-urls "https://127.0.0.1:$ETCD_TLS_PORT" \
    --cert-file "$DIR/tls/server.pem" --key-file "$DIR/tls/server.key" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_TLS_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_TLS_PEER_PORT" \
    --initial-cluster "locksmith-tls=http://127.0.0.1:$ETCD_TLS_PEER_PORT" \
    --initial-cluster-state new --initial-cluster-token "locksmith-tls-test" \
    --heartbeat-interval 50 --election-timeout 500 \
    --logger zap --log-outputs stderr \
    </dev/null >"$d/etcd.log" 2>&1 &
  pid=$!
  echo "$pid" >"$d/etcd.pid"
  wait_for "$T_ETCD" "etcd TLS /health" "$d/etcd.log" "$pid" etcd_tls_health
  {
    etcd_tls_ctl user add root --new-user-password="$ETCD_ROOT_PASS" &&
      etcd_tls_ctl role add locksmith &&
      etcd_tls_ctl role grant-permission locksmith --prefix=true readwrite "$ETCD_PREFIX" &&
      etcd_tls_ctl user add "$ETCD_USER" --new-user-password="$ETCD_PASS" &&
      etcd_tls_ctl user grant-role "$ETCD_USER" locksmith &&
      etcd_tls_ctl auth enable
  } >"$d/setup.log" 2>&1 || {
    tail_log "$d/setup.log" "$d/etcd.log"
    die "etcd TLS auth setup failed"
  }
  wait_for "$T_ETCD" "etcd TLS auth" "$d/setup.log $d/etcd.log" "$pid" etcd_tls_auth_ok
  log "etcd TLS+auth: ready in $(elapsed "$t0") s (port $ETCD_TLS_PORT, data in $data)"
}

# Only the TLS+auth etcd, in $DIR (made if missing; certificates generated if missing).
start_etcd_tls_only() {
  need etcd etcdctl curl openssl setsid timeout
  mkdir -p "$DIR"
  [[ -f $DIR/tls/ca.pem ]] || gen_certs
  stop_etcd_tls_only
  start_etcd_tls
}

stop_etcd_tls_only() {
  local pid f=$DIR/etcd-tls/etcd.pid
  if [[ -f $f ]]; then
    pid=$(head -n1 "$f" | tr -dc 0-9)
    if alive "$pid" && [[ $(comm_of "$pid") == etcd ]]; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$f"
  fi
  if [[ -f $DIR/etcd-tls/datadir ]]; then
    f=$(cat "$DIR/etcd-tls/datadir")
    [[ $f == /dev/shm/locksmith-etcd-tls-* || $f == "$DIR"/* ]] && rm -rf -- "$f"
  fi
  return 0
}

# ---------------------------------------------------------------------------- start

start_all() {
  local t0
  t0=$(now_us)
  need redis-server redis-cli "$PGBIN/initdb" "$PGBIN/pg_ctl" "$PGBIN/psql" mariadb-install-db \
    mariadbd mariadb mariadb-admin java etcd etcdctl curl openssl runuser setsid timeout

  # Leftovers of a previous (possibly crashed) run: by pidfile, then by port.
  stop_all >/dev/null 2>&1 || stop_all || die "could not free our ports"
  local busy
  busy=$(port_listeners)
  [[ -z $busy ]] || die "ports in use by other processes:"$'\n'"$busy"

  if [[ -e $DIR ]]; then
    if [[ -e $DIR/$MARKER ]] || [[ -z $(ls -A "$DIR") ]]; then
      rm -rf -- "$DIR"
    else
      die "$DIR exists and was not made by this script; refusing to delete it"
    fi
  fi
  mkdir -p "$DIR"
  chmod 755 "$DIR"
  touch "$DIR/$MARKER"
  : >"$DIR/locks.db" # an empty file is an empty SQLite database

  gen_certs

  local svc pids=() names=(redis postgres mariadb zookeeper etcd etcd_tls) failed=() i
  for svc in "${names[@]}"; do
    ("start_$svc") >"$DIR/start-$svc.out" 2>&1 &
    pids+=($!)
  done
  for i in "${!names[@]}"; do
    if ! wait "${pids[$i]}"; then failed+=("${names[$i]}"); fi
  done
  for svc in "${names[@]}"; do cat "$DIR/start-$svc.out" >&2; done
  if ((${#failed[@]})); then
    log "FAILED to start: ${failed[*]}; stopping everything"
    stop_all || true
    exit 1
  fi
  log "all servers ready in $(elapsed "$t0") s (dir $DIR)"
}

# ---------------------------------------------------------------------------- env / status

print_env() {
  local q=() p
  for p in "${REDLOCK_PORTS[@]}"; do q+=("redis://127.0.0.1:$p"); done
  local redlock redlock_hosts=() cluster='' zk_pid='' redis_pid=''
  redlock=$(IFS=,; echo "${q[*]}")
  for p in "${REDLOCK_PORTS[@]}"; do redlock_hosts+=("127.0.0.1:$p"); done
  for p in "${CLUSTER_PORTS[@]}"; do cluster+="${cluster:+,}127.0.0.1:$p"; done
  [[ -f $DIR/zk/zk.pid ]] && zk_pid=$(tr -dc 0-9 <"$DIR/zk/zk.pid")
  [[ -f $DIR/redis/$REDIS_PORT/redis.pid ]] && redis_pid=$(tr -dc 0-9 <"$DIR/redis/$REDIS_PORT/redis.pid")
  if [[ -z $zk_pid || -z $redis_pid ]]; then
    log "WARNING: servers do not seem to be running (run: scripts/servers.sh start)"
  fi
  local pg="postgres://$DB_USER:$DB_PASS@127.0.0.1:$PG_PORT/$DB_NAME"
  local vars=(
    "LOCK_TEST_SERVERS_DIR=$DIR"
    "LOCK_TEST_REDIS_URL=redis://127.0.0.1:$REDIS_PORT"
    "LOCK_TEST_REDLOCK_URLS=$redlock"
    "LOCK_TEST_REDLOCK_URL=redlock://$(IFS=,; echo "${redlock_hosts[*]}")"
    "LOCK_TEST_REDIS_AUTH_URL=redis://:$(urlencode "$REDIS_REQUIREPASS")@127.0.0.1:$REDIS_AUTH_PORT"
    "LOCK_TEST_REDIS_ACL_URL=redis://$REDIS_ACL_USER:$(urlencode "$REDIS_ACL_PASS")@127.0.0.1:$REDIS_AUTH_PORT"
    "LOCK_TEST_REDIS_TLS_URL=rediss://127.0.0.1:$REDIS_TLS_PORT"
    "LOCK_TEST_REDIS_TLS_CA=$DIR/tls/ca.pem"
    "LOCK_TEST_REDIS_CLUSTER_URL=redis+cluster://$cluster"
    "LOCK_TEST_POSTGRES_URL=$pg"
    "LOCK_TEST_POSTGRES_TLS_URL=$pg?sslmode=verify-full&sslrootcert=$DIR/tls/ca.pem"
    "LOCK_TEST_MYSQL_URL=mysql://$DB_USER:$DB_PASS@127.0.0.1:$MY_PORT/$DB_NAME"
    "LOCK_TEST_MYSQL_PLAIN_URL=mysql://$DB_PLAIN_USER:$DB_PLAIN_PASS@127.0.0.1:$MY_PORT/$DB_NAME"
    "LOCK_TEST_MYSQL_TLS_URL=mysql://$DB_USER:$DB_PASS@127.0.0.1:$MY_PORT/$DB_NAME?ssl-mode=verify_identity&ssl-ca=$DIR/tls/ca.pem"
    "LOCK_TEST_SQLITE_URL=sqlite://$DIR/locks.db"
    "LOCK_TEST_ZK_URL=zk://127.0.0.1:$ZK_PORT"
    "LOCK_TEST_ZK_TLS_URL=zks://127.0.0.1:$ZK_TLS_PORT?ca=$DIR/tls/ca.pem&cert=$DIR/tls/server.pem&key=$DIR/tls/server.key"
    "LOCK_TEST_ETCD_URL=etcd://127.0.0.1:$ETCD_PORT"
    "LOCK_TEST_ETCD_TLS_URL=etcds://$ETCD_USER:$(urlencode "$ETCD_PASS")@127.0.0.1:$ETCD_TLS_PORT?ca=$DIR/tls/ca.pem"
    "LOCK_TEST_ZK_PID=$zk_pid"
    "LOCK_TEST_REDIS_PID=$redis_pid"
  )
  local v val
  for v in "${vars[@]}"; do
    val=${v#*=}
    printf "export %s='%s'\n" "${v%%=*}" "${val//\'/\'\\\'\'}"
  done
}

status_all() {
  local bad=0 p
  check() {
    local name=$1
    shift
    if "$@" >/dev/null 2>&1; then echo "ok    $name"; else
      echo "DOWN  $name"
      bad=1
    fi
  }
  for p in "$REDIS_PORT" "${REDLOCK_PORTS[@]}"; do check "redis $p" redis_ping "$p"; done
  check "redis $REDIS_AUTH_PORT requirepass" redis_ping "$REDIS_AUTH_PORT" -a "$REDIS_REQUIREPASS"
  check "redis $REDIS_AUTH_PORT acl" redis_ping "$REDIS_AUTH_PORT" --user "$REDIS_ACL_USER" --pass "$REDIS_ACL_PASS"
  check "redis $REDIS_TLS_PORT tls" redis_ping "$REDIS_TLS_PORT" --tls --cacert "$DIR/tls/ca.pem"
  check "redis cluster ${CLUSTER_PORTS[*]}" cluster_ok
  check "postgres $PG_PORT" pg_tcp_ok
  check "mariadb $MY_PORT" my_tcp_ok
  check "zookeeper $ZK_PORT" zk_srvr
  check "zookeeper $ZK_TLS_PORT tls" zk_tls_ok
  check "etcd $ETCD_PORT" etcd_health
  check "etcd $ETCD_TLS_PORT tls+auth" etcd_tls_auth_ok
  return "$bad"
}

case ${1:-} in
  start) start_all ;;
  stop) stop_all ;;
  env) print_env ;;
  status) status_all ;;
  start-etcd-tls) start_etcd_tls_only ;;
  stop-etcd-tls) stop_etcd_tls_only ;;
  *)
    echo "usage: $0 start|stop|env|status|start-etcd-tls|stop-etcd-tls" >&2
    exit 2
    ;;
esac
