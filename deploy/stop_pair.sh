#!/usr/bin/env bash
# Stop the vLLM servers started by deploy/cpu/up.sh or deploy/gpu/launch.sh
# (every RUN_DIR/NAME.pid: the pair, or one server per route; their down.sh
# scripts call this with their own defaults).
#
#   deploy/stop_pair.sh --run-dir DIR [--grace S]
#
# Each server runs in its own process group (API server + EngineCore); the
# group gets SIGTERM, then SIGKILL after the grace period (default 20 s). The
# pid files are removed once no process of the group is left. Exits non-zero
# if a group survives SIGKILL. Safe to run when nothing is running. A server
# that had already exited gets what its log says of it on stderr: a CI run
# keeps no run dir, so this is all that tells why it died. So is a stalled
# server's stack dump (RUN_DIR/NAME.stall.txt, from deploy/cpu/run_tier.sh).
set -euo pipefail

cache="${SPECROUTE_CACHE:-$HOME/.cache/specroute}"
run_dir="$cache/run"
grace=20

log() { printf '[down %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --run-dir) run_dir="${2:?--run-dir needs a value}"; shift 2 ;;
        --grace) grace="${2:?--grace needs a value}"; shift 2 ;;
        -h|--help) sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
        *) log "ERROR: unknown argument: $1"; exit 2 ;;
    esac
done
[[ "$grace" =~ ^[0-9]+$ ]] || { log "ERROR: --grace must be a number of seconds"; exit 2; }

# group_alive PGID: is any process left in the process group?
group_alive() { kill -0 -- "-$1" 2>/dev/null; }

# wait_gone PGID SECONDS
wait_gone() {
    local pgid=$1 deadline=$((SECONDS + $2))
    while group_alive "$pgid"; do
        (( SECONDS >= deadline )) && return 1
        sleep 0.5
    done
}

rc=0
for pidf in "$run_dir"/*.pid; do
    [[ -f "$pidf" ]] || continue
    name="$(basename "$pidf" .pid)"
    pgid=$(<"$pidf")
    if [[ -f "$run_dir/$name.stall.txt" ]]; then  # deploy/cpu/run_tier.sh's stall dump
        cut -c1-200 "$run_dir/$name.stall.txt" >&2
    fi
    if ! [[ "$pgid" =~ ^[0-9]+$ ]] || (( pgid <= 1 )); then
        log "ignoring $pidf: bad content '$pgid'"
        rm -f "$pidf"
        continue
    fi
    if ! group_alive "$pgid"; then
        log "$name (group $pgid) is not running"
        logf="$run_dir/$name.log"
        if [[ -f "$logf" ]]; then
            # The exceptions it logged, each once, in order (a traceback's last line).
            errors="$(grep -avE ' (WARNING|INFO) ' "$logf" \
                | grep -aoE '[A-Za-z0-9_.]*(Error|Exception): .*$' | awk '!seen[$0]++' | head -n 8)" || true
            stalls="$(grep -ac 'No available shared memory broadcast block' "$logf")" || true
            if [[ -n "$errors" || "${stalls:-0}" != 0 ]]; then
                log "$name had exited; its log $logf says:"
                [[ "${stalls:-0}" == 0 ]] \
                    || echo "  ${stalls} x 'No available shared memory broadcast block found in 60 seconds'" >&2
                [[ -z "$errors" ]] || cut -c1-240 <<<"$errors" | sed 's/^/  /' >&2
            fi
        fi
        rm -f "$pidf"
        continue
    fi
    log "stopping $name (process group $pgid): SIGTERM"
    kill -TERM -- "-$pgid" 2>/dev/null || true
    if ! wait_gone "$pgid" "$grace"; then
        log "$name still running after ${grace} s: SIGKILL"
        kill -KILL -- "-$pgid" 2>/dev/null || true
        if ! wait_gone "$pgid" 10; then
            log "ERROR: processes of $name survive SIGKILL:"
            ps -o pid,pgid,stat,cmd -g "$pgid" >&2 || true
            rc=1
            continue
        fi
    fi
    rm -f "$pidf"
    log "$name stopped"
done
rm -f "$run_dir/backends"
exit "$rc"
