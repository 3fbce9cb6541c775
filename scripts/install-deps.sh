#!/usr/bin/env bash
# Installs what distlock's tests and demo need on Debian, only if something is missing:
# redis-server, ZooKeeper (java), etcd (server and etcdctl), protoc (etcd client build),
# and Curator with a JDK for the ZooKeeper interop test.
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
# etcd-client's build compiles protos that import google/protobuf/*.proto, which ship in
# libprotobuf-dev (a recommendation of protobuf-compiler, not installed with it here).
[ -f /usr/include/google/protobuf/descriptor.proto ] || missing+=(libprotobuf-dev)
{ command -v java >/dev/null 2>&1 && [ -f /usr/share/java/zookeeper.jar ]; } || missing+=(zookeeper)
# Curator interop test: a Java InterProcessMutex compiled at test time.
command -v javac >/dev/null 2>&1 || missing+=(default-jdk-headless)
# TLS tests make throwaway certificates.
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
[ -f /usr/share/java/curator-recipes.jar ] || missing+=(libcurator-recipes-java)
[ -f /usr/share/java/slf4j-nop.jar ] || missing+=(libslf4j-java)

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: redis-server, zookeeper, etcd, etcdctl, protoc (with the well-known protos), javac and Curator are present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "install-deps: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Packages may start system-wide services on install; the harness starts its own servers.
for service in redis-server zookeeper etcd; do
  $sudo service "$service" stop >/dev/null 2>&1 || true
done
echo "install-deps: done"
