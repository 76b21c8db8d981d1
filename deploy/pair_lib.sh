# shellcheck shell=bash disable=SC2154  # run_dir, timeout_s, here, started: the caller's
# Shared by deploy/cpu/up.sh and deploy/gpu/launch.sh (sourced, not run).
# Needs from the caller: run_dir, timeout_s, here (its own folder, with a
# down.sh), a started array and a log() function.

# cleanup_on_error: an EXIT trap that stops what was started when the script
# fails, so a half-started pair never outlives it.
cleanup_on_error() {
    local rc=$?
    if [[ $rc -ne 0 && ${#started[@]} -gt 0 ]]; then
        log "stopping what was started"
        bash "$here/down.sh" --run-dir "$run_dir" || true
    fi
    exit "$rc"
}

# wait_ready NAME BASE_URL [POLL_S]: polls BASE_URL/v1/models until it answers
# 200; fails with the log's tail if the server exits or times out first.
wait_ready() {
    local name=$1 url=$2 poll=${3:-1} t0=$SECONDS pid=""
    local logf="$run_dir/$name.log" pidf="$run_dir/$name.pid"
    while true; do
        [[ -z "$pid" && -s "$pidf" ]] && pid=$(<"$pidf")
        if curl -fsS -o /dev/null --max-time 2 "$url/v1/models" 2>/dev/null; then
            log "$name ready after $((SECONDS - t0)) s"
            return 0
        fi
        if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
            log "$name exited before it was ready; last lines of $logf:"
            tail -n 40 "$logf" >&2
            return 1
        fi
        if (( SECONDS - t0 >= timeout_s )); then
            log "$name not ready after ${timeout_s} s; last lines of $logf:"
            tail -n 40 "$logf" >&2
            return 1
        fi
        sleep "$poll"
    done
}
