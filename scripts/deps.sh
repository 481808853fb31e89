#!/usr/bin/env bash
# Installs the Debian packages kvpaged needs to build and test.  Idempotent: quiet and fast when
# everything is there; runs apt-get (as root) only for what is missing.
set -euo pipefail

packages=(
	autoconf automake libtool pkg-config make gcc clang python3
	libxxhash-dev libjson-c-dev check libinih-dev liburing-dev libmicrohttpd-dev
	libprotobuf-c-dev protobuf-c-compiler fio
	redis-server libhiredis-dev libssl-dev # the remote tier (tests run their own redis-servers)
	libzmq3-dev libmsgpack-dev python3-zmq python3-msgpack # the event stream, and its tests' subscriber
	python3-numpy python3-pytest # the Python binding (python/) and its tests
	python3-torch # pool.tensor() and its tests (a large package: about 600 MB installed)
	libsystemd-dev systemd man-db debhelper dpkg-dev lintian
	prometheus # promtool, and a real server (tests/ops/metrics.test, prometheus.test)
	debootstrap systemd-container # a Debian 12 root booted under systemd (tests/ops/boot.test)
)

missing=()
for p in "${packages[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
	echo "deps: missing packages: ${missing[*]} (run as root, or install them)" >&2
	exit 1
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

# The package starts a redis-server on 6379 and enables it at boot; the tests start their own on
# free ports, so the packaged service is only in the way.
if [[ " ${missing[*]} " == *" redis-server "* ]]; then
	if [ -d /run/systemd/system ]; then
		systemctl disable --now -q redis-server.service 2>/dev/null || true
	elif [ -x /etc/init.d/redis-server ]; then
		/etc/init.d/redis-server stop >/dev/null 2>&1 || true
		update-rc.d redis-server disable >/dev/null 2>&1 || true
	fi
fi
