#!/usr/bin/env bash
# Installs what distlock's tests and demo need on Debian, only if something is missing:
# redis-server, ZooKeeper (java), etcd (server and etcdctl) and protoc (etcd client build).
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
{ command -v java >/dev/null 2>&1 && [ -f /usr/share/java/zookeeper.jar ]; } || missing+=(zookeeper)

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: redis-server, zookeeper, etcd, etcdctl and protoc are present"
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
