#!/usr/bin/env bash
# Start (or stop) a Docker engine of our own, for machines where none runs: Debian's dockerd, as
# root, with its own state, socket and log under DIR, so it never touches another engine.
#
#   deploy/offline/dockerd.sh start DIR    then: export DOCKER_HOST=unix://DIR/docker.sock
#   deploy/offline/dockerd.sh stop DIR     (SIGTERM, then SIGKILL after 30 s; containers die with it;
#                                          what it mounted under DIR is unmounted)
#
# Images and layers live in FEDGAN_DOCKER_DATA_ROOT (default ~/.cache/fedgan-offline/docker), so a
# second start finds the images already built. overlay2 is tried first, vfs (slow, but it works on
# any filesystem) where overlay2 cannot start. `--bridge=none`: no docker0 on the host; the compose
# files bring their own network with an explicit subnet, and the image builds use the host network.
set -euo pipefail

say() { printf 'dockerd.sh: %s\n' "$*" >&2; }
[ $# -eq 2 ] || { say "usage: $0 start|stop DIR"; exit 2; }
action="$1"; dir="$(mkdir -p "$2" && cd "$2" && pwd)"
sock="$dir/docker.sock"; pidfile="$dir/docker.pid"
data_root="${FEDGAN_DOCKER_DATA_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/fedgan-offline/docker}"

running() { [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }
answers() { DOCKER_HOST="unix://$sock" docker info >/dev/null 2>&1; }

stop() {
    running || { rm -f "$pidfile"; unmount_exec_root; return 0; }
    local pid; pid="$(cat "$pidfile")"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then say "dockerd $pid ignored SIGTERM for 30 s; SIGKILL"; kill -KILL "$pid" || true; fi
    rm -f "$pidfile"
    unmount_exec_root
}

unmount_exec_root() {  # dockerd leaves its network namespace bind-mounted under the exec root
    awk -v d="$dir/exec/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done
    rm -rf "$dir/exec"
}

start_with() {  # $1: storage driver; 0 when the engine answers within 60 s
    mkdir -p "$data_root" "$dir/exec"
    dockerd --data-root "$data_root" --exec-root "$dir/exec" --pidfile "$pidfile" \
        --host "unix://$sock" --storage-driver "$1" --bridge none \
        >>"$dir/dockerd.log" 2>&1 &
    local pid=$!
    for _ in $(seq 600); do
        answers && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

case "$action" in
start)
    command -v dockerd >/dev/null || { say "dockerd is missing: apt-get install docker.io"; exit 2; }
    [ "$(id -u)" = 0 ] || { say "dockerd needs root"; exit 2; }
    if running && answers; then say "already running (pid $(cat "$pidfile"))"; echo "unix://$sock"; exit 0; fi
    for driver in overlay2 vfs; do
        if start_with "$driver"; then
            say "dockerd running (pid $(cat "$pidfile"), storage $driver, data $data_root)"
            echo "unix://$sock"
            exit 0
        fi
        say "dockerd did not start with $driver storage (log: $dir/dockerd.log)"
        stop
    done
    exit 1
    ;;
stop) stop ;;
*) say "usage: $0 start|stop DIR"; exit 2 ;;
esac
