#!/usr/bin/env bash
# Sets up what distlock's build, tests and demo need on Debian, and shows that it works.
#
# Each row of DEPS is one Debian package (or, as rustup:NAME, one component of the Rust
# toolchain) the build or the tests need, the capability it brings and the check that shows
# the capability works on this machine (a program runs, compiles or loads its classes; not
# merely a file exists). A row is checked only once the rows it needs pass, so one absent
# package is reported once, by its own row. Rust itself (rustup, cargo) is a prerequisite.
#
#   scripts/install-deps.sh          check; install the packages of every row that does not
#                                    pass (apt-get --no-install-recommends, rustup component
#                                    add); check again and fail naming each capability still
#                                    missing
#   scripts/install-deps.sh --check  check only: one line per row, exit 1 unless all pass
#   scripts/install-deps.sh --list   the table: package, the rows it needs, capability
#
# scripts/prove-install-deps.sh hides each package in turn and shows that --check names it.
set -euo pipefail

# package | packages it needs | check | capability
DEPS=(
  "rustup:rustfmt||check_rustfmt|cargo fmt and rustfmt run (make test checks formatting)"
  "rustup:clippy||check_clippy|cargo clippy and clippy-driver run (make test lints)"
  "gcc||check_cc|cc runs (rustc links with it; the build scripts of ring and aws-lc-sys compile C with it)"
  "libc6-dev|gcc|check_c_program|cc compiles and links a C program against libc (and the harness its wall-clock library for redis-server)"
  "protobuf-compiler||check_protoc|protoc compiles a .proto file (etcd-client's build script runs it)"
  "libprotobuf-dev|protobuf-compiler|check_protoc_imports|protoc compiles a .proto importing google/protobuf/descriptor.proto (etcd-client's protos do)"
  "redis-server||check_redis|redis-server 7 or later runs (the harness's Redis servers, Sentinels as redis-server --sentinel, and Cluster nodes: sharded pub/sub, script flags)"
  "etcd-server||check_etcd|etcd runs (the harness's etcd servers, the etcds:// test)"
  "postgresql||check_postgresql|postgres, initdb and pg_basebackup of the newest /usr/lib/postgresql/*/bin run as the OS user postgres (the harness's PostgreSQL servers and replicas)"
  "util-linux||check_flock|flock(1) runs and takes a lock a second flock -n then cannot (the file:// interop test runs the real flock)"
  "etcd-client||check_etcdctl|etcdctl runs (the etcdctl lock interop test)"
  "openssl||check_openssl|openssl makes a CA and a server certificate it signs, as the TLS tests do"
  "default-jre-headless||check_java|java runs (ZooKeeper, the Curator holder)"
  "default-jdk-headless|default-jre-headless|check_javac|javac runs (the Curator test compiles its holder with it)"
  "libslf4j-java||check_jars slf4j-api.jar slf4j-nop.jar|slf4j-api.jar and slf4j-nop.jar in /usr/share/java (ZooKeeper's and Curator's logging)"
  "libguava-java||check_jars guava.jar|guava.jar in /usr/share/java (Curator's class path)"
  "libzookeeper-java|default-jre-headless libslf4j-java|check_zookeeper|ZooKeeper's server starts from the class path the harness builds and reads its config; zookeeper-jute.jar is there"
  "libnetty-java|default-jdk-headless libzookeeper-java|check_zookeeper_netty|ZooKeeper's Netty connection factory (the TLS port of the zks:// tests) links on the harness's class path: zookeeper.jar, netty-codec.jar and netty-resolver.jar"
  "libcurator-client-java||check_jars curator-client.jar|curator-client.jar in /usr/share/java"
  "libcurator-framework-java||check_jars curator-framework.jar|curator-framework.jar in /usr/share/java"
  "libcurator-recipes-java|default-jdk-headless libslf4j-java libguava-java libzookeeper-java libcurator-client-java libcurator-framework-java|check_curator|javac compiles, and java runs, a program taking Curator's InterProcessMutex on the Curator test's class path"
  "libfaketime||check_libfaketime|libfaketime.so.1, preloaded where the harness finds it, moves a running program's wall clock when its FAKETIME_TIMESTAMP_FILE changes (the clock-jump fault scenarios on ZooKeeper)"
  "faketime|libfaketime|check_faketime|faketime runs a program on a shifted wall clock (the clock-jump scenarios by hand)"
)

JAR_DIR=/usr/share/java
# A JVM that starts fast: these checks run for well under a second each.
JVM=(-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData)
JAVAC=(-J-XX:TieredStopAtLevel=1 -J-XX:+UseSerialGC -J-XX:-UsePerfData)
# Where the harness looks for zookeeper.jar (harness/src/zookeeper/).
ZK_JAR_DIRS=(/usr/share/java /usr/share/zookeeper /usr/share/zookeeper/lib)
# Netty jars the harness adds to ZooKeeper's class path (NETTY_EXTRA_JARS in
# harness/src/zookeeper/): zookeeper.jar's manifest does not name them.
NETTY_EXTRA_JARS=(netty-codec.jar netty-resolver.jar)
# The class path of the Curator test (lock-zookeeper/tests/it/interop.rs).
CURATOR_JARS=(curator-recipes.jar curator-framework.jar curator-client.jar zookeeper.jar
  zookeeper-jute.jar guava.jar slf4j-api.jar slf4j-nop.jar)

check_rustfmt() {
  cargo fmt --version && rustfmt --version
}

check_clippy() {
  cargo clippy --version && clippy-driver --version
}

check_cc() {
  cc --version
}

check_c_program() {
  printf '#include <stdio.h>\nint main(void) { puts("c ok"); return 0; }\n' >"$work/hello.c"
  cc -o "$work/hello" "$work/hello.c" && [ "$("$work/hello")" = "c ok" ]
}

check_protoc() {
  printf 'syntax = "proto3";\nmessage Plain { string s = 1; }\n' >"$work/plain.proto"
  protoc --version && protoc -I "$work" --descriptor_set_out="$work/plain.pb" "$work/plain.proto"
}

check_protoc_imports() {
  printf '%s\n' 'syntax = "proto3";' 'import "google/protobuf/descriptor.proto";' \
    'message Imports { google.protobuf.FileDescriptorProto file = 1; }' >"$work/imports.proto"
  protoc -I "$work" --descriptor_set_out="$work/imports.pb" "$work/imports.proto"
}

# Redis 7 at least: the Cluster tests use sharded pub/sub and script flags.
check_redis() {
  local major
  major=$(redis-server --version | sed -n 's/.*Redis server v=\([0-9]*\)\..*/\1/p')
  redis-server --version && [ -n "$major" ] && [ "$major" -ge 7 ]
}

check_etcd() {
  etcd --version | grep 'etcd Version:'
}

# As harness/src/postgres/ finds and runs them: the newest /usr/lib/postgresql/<version>/bin
# holding postgres and initdb; as root, run as the OS user postgres (the server refuses root).
check_postgresql() {
  local bin dir run=()
  bin=$(for dir in /usr/lib/postgresql/*/bin; do
    [ -x "$dir/postgres" ] && [ -x "$dir/initdb" ] && echo "$dir"
  done | sort -V | tail -n 1)
  [ -n "$bin" ] || { echo "no postgres and initdb in /usr/lib/postgresql/*/bin"; return 1; }
  if [ "$(id -u)" -eq 0 ]; then
    id -u postgres || { echo "no OS user postgres"; return 1; }
    run=(runuser -u postgres --)
  fi
  "${run[@]}" "$bin/postgres" --version && "${run[@]}" "$bin/initdb" --version &&
    "${run[@]}" "$bin/pg_basebackup" --version
}

check_flock() {
  local file="$work/flock-check"
  flock --version && flock "$file" sh -c "! flock -n '$file' true"
}

check_etcdctl() {
  ETCDCTL_API=3 etcdctl version | grep 'etcdctl version:'
}

# The steps of harness/src/tls.rs, which makes the TLS tests' certificates.
check_openssl() {
  local dir="$work/tls" key=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
  mkdir -p "$dir" && cd "$dir" &&
    printf '%s\n' basicConstraints=CA:FALSE keyUsage=digitalSignature \
      extendedKeyUsage=serverAuth subjectAltName=IP:127.0.0.1,DNS:localhost >server.ext &&
    openssl req -x509 -days 1 -subj "/CN=distlock check CA" "${key[@]}" \
      -keyout ca.key -out ca.pem &&
    openssl req -subj /CN=localhost "${key[@]}" -keyout server.key -out server.csr &&
    openssl x509 -req -days 1 -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
      -extfile server.ext -out server.pem &&
    openssl verify -CAfile ca.pem server.pem
}

check_java() {
  java "${JVM[@]}" -version
}

# Compiling is left to the Curator row, which compiles what the Curator test compiles.
check_javac() {
  javac "${JAVAC[@]}" -version
}

check_jars() {
  local jar status=0
  for jar in "$@"; do
    [ -f "$JAR_DIR/$jar" ] || { echo "no $JAR_DIR/$jar"; status=1; }
  done
  return "$status"
}

# The class path harness/src/zookeeper/ builds: zookeeper.jar (its manifest
# names the rest) and a log binding, log4j 1.2 or else slf4j-simple. A missing config file
# makes QuorumPeerMain exit 2 with "Invalid config" once its classes and logging loaded.
check_zookeeper() {
  local dir jar="" cp out rc=0
  for dir in "${ZK_JAR_DIRS[@]}"; do
    [ -f "$dir/zookeeper.jar" ] && { jar="$dir/zookeeper.jar"; break; }
  done
  [ -n "$jar" ] || { echo "no zookeeper.jar in ${ZK_JAR_DIRS[*]}"; return 1; }
  check_jars zookeeper-jute.jar || return 1
  cp="$jar"
  if [ -f "$JAR_DIR/slf4j-log4j12.jar" ] && [ -f "$JAR_DIR/log4j-1.2.jar" ]; then
    cp="$cp:$JAR_DIR/slf4j-log4j12.jar:$JAR_DIR/log4j-1.2.jar"
  elif [ -f "$JAR_DIR/slf4j-simple.jar" ]; then
    cp="$cp:$JAR_DIR/slf4j-simple.jar"
  fi
  out=$(java "${JVM[@]}" -cp "$cp" org.apache.zookeeper.server.quorum.QuorumPeerMain \
    "$work/absent.cfg" 2>&1) || rc=$?
  echo "$out"
  [ "$rc" -eq 2 ] && grep -q 'Invalid config' <<<"$out"
}

# A TLS ZooKeeper (ZkOptions::tls) runs the Netty connection factory, whose SSL handler
# extends netty-codec's ByteToMessageDecoder: loading it links what a TLS connection needs.
check_zookeeper_netty() {
  local cp jar
  cp=$(for jar in zookeeper.jar "${NETTY_EXTRA_JARS[@]}"; do printf '%s:' "$JAR_DIR/$jar"; done)
  mkdir -p "$work/netty" && cat >"$work/netty/NettyCheck.java" <<'EOF'
public class NettyCheck {
    public static void main(String[] args) throws Exception {
        Class.forName("org.apache.zookeeper.server.NettyServerCnxnFactory$DualModeSslHandler");
        System.out.println("netty ok");
    }
}
EOF
  javac "${JAVAC[@]}" -d "$work/netty" "$work/netty/NettyCheck.java" &&
    [ "$(java "${JVM[@]}" -cp "$work/netty:$cp" NettyCheck)" = "netty ok" ]
}

check_curator() {
  local cp jar
  cp=$(for jar in "${CURATOR_JARS[@]}"; do printf '%s:' "$JAR_DIR/$jar"; done)
  mkdir -p "$work/curator" && cat >"$work/curator/CuratorCheck.java" <<'EOF'
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;

public class CuratorCheck {
    public static void main(String[] args) throws Exception {
        Class.forName("org.slf4j.impl.StaticLoggerBinder");
        CuratorFramework client = CuratorFrameworkFactory.builder()
            .connectString("127.0.0.1:1").retryPolicy(new RetryNTimes(0, 1)).build();
        new InterProcessMutex(client, "/distlock-check");
        client.close();
        System.out.println("curator ok");
    }
}
EOF
  javac "${JAVAC[@]}" -d "$work/curator" -cp "$cp" "$work/curator/CuratorCheck.java" &&
    [ "$(java "${JVM[@]}" -cp "$work/curator:$cp" CuratorCheck)" = "curator ok" ]
}

# Where the harness looks for libfaketime (FAKE_CLOCK_LIBS in
# harness/src/clock.rs).
FAKETIME_LIBS=(/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1
  /usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1 /usr/lib/faketime/libfaketime.so.1
  /usr/local/lib/faketime/libfaketime.so.1)

# Seconds between two readings of the wall clock, $1 - $2, within 5 s of $3.
about() {
  local diff=$(($1 - $2))
  echo "clock moved by ${diff}s, wanted about $3 s"
  [ "$diff" -ge $(($3 - 5)) ] && [ "$diff" -le $(($3 + 5)) ]
}

# As the harness runs ZooKeeper: the library preloaded, the offset read again from a file
# once a second, the monotonic clock left alone. One running program reads the wall clock,
# moves it back a day by rewriting the file, waits past the cache (up to 2 s: whole seconds),
# and reads it again.
check_libfaketime() {
  local lib="" candidate readings
  for candidate in "${FAKETIME_LIBS[@]}"; do
    [ -f "$candidate" ] && { lib=$candidate; break; }
  done
  [ -n "$lib" ] || { echo "no libfaketime.so.1 in ${FAKETIME_LIBS[*]}"; return 1; }
  echo "+0s" >"$work/clock"
  readings=$(LD_PRELOAD=$lib FAKETIME_TIMESTAMP_FILE="$work/clock" FAKETIME_CACHE_DURATION=1 \
    FAKETIME_DONT_FAKE_MONOTONIC=1 perl -e '
      my $before = time;
      open(my $f, ">", $ARGV[0]) or die "$!"; print $f "-1d\n"; close($f);
      select(undef, undef, undef, 2.5);
      print $before, " ", time, "\n";' "$work/clock")
  echo "readings: $readings"
  # shellcheck disable=SC2086 # two numbers
  about $readings 86400
}

check_faketime() {
  local now shifted
  now=$(date +%s)
  shifted=$(faketime -f '+1d' date +%s)
  about "$shifted" "$now" 86400
}

# Runs every row, each as soon as the rows it needs pass, in parallel; sets status[pkg] to
# ok, missing, or unchecked (a row it needs did not pass).
check_all() {
  local row pkg needs check capability need rc ready running
  status=()
  rm -f "$work"/*.rc
  while :; do
    running=0
    for row in "${DEPS[@]}"; do
      IFS='|' read -r pkg needs check capability <<<"$row"
      if [ "${status[$pkg]:-}" = running ] && [ -f "$work/$pkg.rc" ]; then
        rc=$(<"$work/$pkg.rc")
        [ "$rc" = 0 ] && status[$pkg]=ok || status[$pkg]=missing
      fi
      [ "${status[$pkg]:-}" = running ] && running=$((running + 1))
      [ -z "${status[$pkg]:-}" ] || continue
      ready=1
      for need in $needs; do
        case "${status[$need]:-}" in
          ok) ;;
          missing | unchecked)
            status[$pkg]=unchecked
            continue 2
            ;;
          *) ready=0 ;;
        esac
      done
      [ "$ready" = 1 ] || continue
      status[$pkg]=running
      running=$((running + 1))
      {
        # shellcheck disable=SC2086 # the check's arguments are words of the table
        if (cd "$work" && $check) >"$work/$pkg.log" 2>&1; then rc=0; else rc=1; fi
        echo "$rc" >"$work/$pkg.rc.part" && mv "$work/$pkg.rc.part" "$work/$pkg.rc"
      } &
    done
    [ "$running" -gt 0 ] || break
    wait -n || true
  done
  for row in "${DEPS[@]}"; do
    IFS='|' read -r pkg needs check capability <<<"$row"
    [ -n "${status[$pkg]:-}" ] || status[$pkg]=unchecked
  done
}

# One line per row that is not ok (all rows with --verbose): status, package, capability.
report() {
  local row pkg needs check capability
  for row in "${DEPS[@]}"; do
    IFS='|' read -r pkg needs check capability <<<"$row"
    case "${status[$pkg]}" in
      ok) [ "${1:-}" = --verbose ] && printf 'ok        %-26s %s\n' "$pkg" "$capability" ;;
      missing) printf 'missing   %-26s %s\n' "$pkg" "$capability" ;;
      *) printf 'unchecked %-26s needs: %s\n' "$pkg" "$needs" ;;
    esac
  done
  return 0
}

all_ok() {
  local pkg
  for pkg in "${!status[@]}"; do
    [ "${status[$pkg]}" = ok ] || return 1
  done
}

installed() {
  case "$1" in
    rustup:*) rustup component list --installed 2>/dev/null | grep -q "^${1#rustup:}-" ;;
    *) [ "$(dpkg-query -W -f '${db:Status-Status}' "$1" 2>/dev/null)" = installed ] ;;
  esac
}

# Installs the rows' packages "$@": rustup components, then Debian packages.
install() {
  local sudo="" pkg components=() debs=()
  for pkg in "$@"; do
    case "$pkg" in
      rustup:*) components+=("${pkg#rustup:}") ;;
      *) debs+=("$pkg") ;;
    esac
  done
  if [ ${#components[@]} -gt 0 ]; then
    command -v rustup >/dev/null 2>&1 || {
      echo "install-deps: need rustup to add ${components[*]} to the Rust toolchain" >&2
      exit 1
    }
    echo "install-deps: rustup component add ${components[*]}"
    rustup component add "${components[@]}"
  fi
  [ ${#debs[@]} -gt 0 ] || return 0
  set -- "${debs[@]}"
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || {
      echo "install-deps: need root or sudo to install $*" >&2
      exit 1
    }
    sudo="sudo"
  fi
  echo "install-deps: installing $*"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  # The server packages start system-wide services on install; the harness runs its own.
  for pkg in "$@"; do
    case "$pkg" in
      redis-server) $sudo service redis-server stop >/dev/null 2>&1 || true ;;
      etcd-server) $sudo service etcd stop >/dev/null 2>&1 || true ;;
      postgresql) $sudo service postgresql stop >/dev/null 2>&1 || true ;;
    esac
  done
}

main() {
  local mode="${1:-install}" row pkg needs check capability
  case "$mode" in
    --list)
      for row in "${DEPS[@]}"; do
        IFS='|' read -r pkg needs check capability <<<"$row"
        printf '%s\t%s\t%s\n' "$pkg" "${needs:--}" "$capability"
      done
      return 0
      ;;
    --check | install) ;;
    *)
      echo "usage: $0 [--check | --list]" >&2
      return 2
      ;;
  esac

  work=$(mktemp -d "${TMPDIR:-/tmp}/install-deps.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  declare -gA status
  check_all
  if [ "$mode" = --check ]; then
    report --verbose
    all_ok
    return
  fi
  if all_ok; then
    echo "install-deps: all ${#DEPS[@]} capabilities present (--check lists them)"
    return 0
  fi

  # Rows that do not pass, and rows waiting on them unless their package is installed.
  report
  local wanted=()
  for row in "${DEPS[@]}"; do
    IFS='|' read -r pkg needs check capability <<<"$row"
    case "${status[$pkg]}" in
      missing) wanted+=("$pkg") ;;
      unchecked) installed "$pkg" || wanted+=("$pkg") ;;
    esac
  done
  install "${wanted[@]}"

  check_all
  if all_ok; then
    echo "install-deps: done; all ${#DEPS[@]} capabilities present"
    return 0
  fi
  echo "install-deps: FAILED: still missing after installing ${wanted[*]}:" >&2
  for row in "${DEPS[@]}"; do
    IFS='|' read -r pkg needs check capability <<<"$row"
    [ "${status[$pkg]}" = ok ] && continue
    echo "  - $capability  [package $pkg: ${status[$pkg]}]" >&2
    if [ "${status[$pkg]}" = missing ]; then
      tail -n 15 "$work/$pkg.log" | sed 's/^/      /' >&2
      installed "$pkg" && echo "      dpkg has $pkg installed: its files may be damaged" \
        "(apt-get install --reinstall $pkg)" >&2
    fi
  done
  return 1
}

main "$@"
