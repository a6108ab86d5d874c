#!/usr/bin/env bash
# Docker for the docker workspace runtime (roll_async/workspaces/docker.py) and its tests; idempotent, and a
# few seconds when everything is already there. .ci/run calls it before the tests, so they never skip there.
#   1. dockerd: installed from Debian (apt-get install docker.io) when missing; only as root with apt-get.
#   2. a daemon: when `docker info` gets no answer, dockerd starts in the background (its log:
#      ROLL_ASYNC_DOCKERD_LOG, default /var/log/roll-async-dockerd.log) and this waits up to
#      ROLL_ASYNC_DOCKERD_WAIT_S (default 60) seconds for it to answer.
#   3. the offline base image ROLL_ASYNC_SWE_IMAGE (default roll-async/swe-base:1): no image registry is
#      needed; debootstrap builds a minimal Debian root (python3, pytest, git, bash, coreutils, procps, an
#      `agent` user with uid 1000 and /workspace) from the apt mirror and `docker import` turns it into an
#      image. Skipped when the image exists.
# `roll-async build-image` runs this script.
set -euo pipefail
image="${ROLL_ASYNC_SWE_IMAGE:-roll-async/swe-base:1}"
log="${ROLL_ASYNC_DOCKERD_LOG:-/var/log/roll-async-dockerd.log}"
wait_s="${ROLL_ASYNC_DOCKERD_WAIT_S:-60}"
suite="${ROLL_ASYNC_DEBIAN_SUITE:-bookworm}"
mirror="${ROLL_ASYNC_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
packages="python3,python3-pytest,git,bash,coreutils,procps"

die() { echo "[docker-setup] $*" >&2; exit 1; }

apt_install() {
  # Quiet; an update first only when the package lists are stale.
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
    || die "$1 is missing and this is not root with apt-get: install it (Debian: apt-get install -y $1)"
  echo "[docker-setup] installing $1 (apt)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$1" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$1" >/dev/null; } \
    || die "apt-get install $1 failed"
}

daemon_answers() { timeout 10 docker info >/dev/null 2>&1; }

if ! daemon_answers; then
  if ! command -v dockerd >/dev/null; then
    apt_install docker.io
  fi
  command -v docker >/dev/null || die "no docker client on PATH after installing docker.io"
  if ! daemon_answers; then
    [ "$(id -u)" = 0 ] || die "no Docker daemon answers and only root can start dockerd: start it (sudo dockerd &) or set DOCKER_HOST"
    echo "[docker-setup] starting dockerd in the background (log: $log)"
    mkdir -p "$(dirname "$log")"
    # a daemon that died (a machine restored from a snapshot) leaves its pid file; dockerd refuses to start
    if ! pgrep -x dockerd >/dev/null 2>&1; then rm -f /var/run/docker.pid; fi
    # setsid: the daemon outlives this script and the terminal or CI step that ran it.
    setsid dockerd >>"$log" 2>&1 < /dev/null &
    waited=0
    until daemon_answers; do
      if [ "$waited" -ge "$wait_s" ]; then
        tail -n 20 "$log" >&2 || true
        die "dockerd did not answer within ${wait_s}s; its log: $log"
      fi
      sleep 1
      waited=$((waited + 1))
    done
  fi
fi
echo "[docker-setup] daemon: $(docker version --format 'server {{.Server.Version}}, API {{.Server.APIVersion}}')"

if docker image inspect "$image" >/dev/null 2>&1; then
  echo "[docker-setup] image $image exists"
  exit 0
fi
[ "$(id -u)" = 0 ] || die "building $image needs root (debootstrap); run this script as root"
command -v debootstrap >/dev/null || apt_install debootstrap
work="$(mktemp -d /var/tmp/roll-async-rootfs.XXXXXX)"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
echo "[docker-setup] building $image: debootstrap --variant=minbase $suite ($packages) from $mirror"
debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -n 20 "$work/debootstrap.log" >&2; die "debootstrap failed (log above); check that $mirror is reachable"; }
# The unprivileged user agent commands run as (the runtime's agent_user, 1000:1000), and the workdir.
echo "agent:x:1000:1000:agent:/home/agent:/bin/bash" >>"$rootfs/etc/passwd"
echo "agent:x:1000:" >>"$rootfs/etc/group"
echo "agent:*:19000:0:99999:7:::" >>"$rootfs/etc/shadow"
mkdir -p "$rootfs/home/agent" "$rootfs/workspace"
chown 1000:1000 "$rootfs/home/agent" "$rootfs/workspace"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* \
  "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
tar -C "$rootfs" --numeric-owner -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'WORKDIR /workspace' \
  --change 'CMD ["sleep", "infinity"]' \
  - "$image" >/dev/null
echo "[docker-setup] image $image built ($(docker image inspect "$image" --format '{{.Size}}') bytes)"
