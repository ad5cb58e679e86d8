#!/usr/bin/env bash
# Builds Loom's pinned tools from source (Go module proxy only) into a cache
# directory outside the checkout, keyed by version, and prints the directory
# holding each requested tool. A tool already in the cache is not rebuilt.
#
#   hack/tools/build.sh kube      -> etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
#   hack/tools/build.sh kwok helm controller-gen golangci-lint
#   hack/tools/build.sh prometheus-operator -> operator, crds/ (its own CRDs)
#   hack/tools/build.sh kueue -> kueue, config/ (its CRDs, webhooks, conversion patches)
#   hack/tools/build.sh kuberay -> ray-operator, crds/ (benchmark anchor: KubeRay's operator)
#   hack/tools/build.sh training-operator -> training-operator, crds/ (benchmark anchor: Kubeflow's)
#
# LOOM_TOOLS_DIR overrides the cache root (default: ~/.cache/loom/tools).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
root="${LOOM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/loom/tools}"
export GOFLAGS="${GOFLAGS:-} -trimpath"

log() { echo "build.sh: $*" >&2; }

# install NAME VERSION PKG: go install PKG@VERSION into root/NAME-VERSION.
install_tool() {
	local name="$1" version="$2" pkg="$3" dir="$root/$1-$2"
	if [[ ! -x "$dir/$name" ]]; then
		log "building $name $version (once; cached in $dir)"
		mkdir -p "$dir.tmp"
		GOBIN="$dir.tmp" go install "$pkg@$version"
		rm -rf "$dir" && mv "$dir.tmp" "$dir"
	fi
	echo "$dir"
}

build_kube() {
	local dir="$root/kubernetes-$KUBERNETES_VERSION-etcd-$ETCD_VERSION"
	local bins=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl) missing=0 b
	for b in "${bins[@]}"; do [[ -x "$dir/$b" ]] || missing=1; done
	if [[ $missing == 1 ]]; then
		log "building Kubernetes $KUBERNETES_VERSION and etcd $ETCD_VERSION (once; cached in $dir)"
		local major minor
		major="$(echo "${KUBERNETES_VERSION#v}" | cut -d. -f1)"
		minor="$(echo "${KUBERNETES_VERSION#v}" | cut -d. -f2)"
		local v=k8s.io/component-base/version
		local ldflags="-s -w -X $v.gitVersion=$KUBERNETES_VERSION -X $v.gitMajor=$major -X $v.gitMinor=$minor -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
		mkdir -p "$dir.tmp"
		(
			cd "$here"
			go build -ldflags "$ldflags" -o "$dir.tmp/" \
				k8s.io/kubernetes/cmd/kube-apiserver \
				k8s.io/kubernetes/cmd/kube-controller-manager \
				k8s.io/kubernetes/cmd/kube-scheduler \
				k8s.io/kubernetes/cmd/kubectl
			go build -ldflags "-s -w" -o "$dir.tmp/etcd" go.etcd.io/etcd/server/v3
		)
		rm -rf "$dir" && mv "$dir.tmp" "$dir"
	fi
	echo "$dir"
}

# kwok_stages DIR: write the kwok module's default node (fast,
# heartbeat-with-lease) and pod (fast) stages into DIR/stages.yaml; without a
# stages config kwok exits with "no stages found".
kwok_stages() {
	local dir="$1" src
	[[ -s "$dir/stages.yaml" ]] && return 0
	src="$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
	[[ -d "$src" ]] || { log "kwok module source not found"; exit 1; }
	local f
	for f in "$src"/kustomize/stage/node/fast/*.yaml "$src"/kustomize/stage/node/heartbeat-with-lease/*.yaml "$src"/kustomize/stage/pod/fast/*.yaml; do
		[[ "$(basename "$f")" == kustomization.yaml ]] && continue
		echo "---"
		cat "$f"
	done > "$dir/stages.yaml.tmp"
	mv "$dir/stages.yaml.tmp" "$dir/stages.yaml"
}

# build_prometheus_operator: the operator binary, built in its own wrapper
# module (prometheus-operator/), and the CRDs of that version from the
# module's example/prometheus-operator-crd into DIR/crds.
build_prometheus_operator() {
	local dir="$root/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION"
	if [[ ! -x "$dir/operator" || ! -d "$dir/crds" ]]; then
		log "building prometheus-operator $PROMETHEUS_OPERATOR_VERSION (once; cached in $dir)"
		rm -rf "$dir.tmp" && mkdir -p "$dir.tmp/crds"
		(
			cd "$here/prometheus-operator"
			local mod="github.com/prometheus-operator/prometheus-operator" src
			[[ "$(go list -m -f '{{.Version}}' "$mod")" == "$PROMETHEUS_OPERATOR_VERSION" ]] || {
				log "prometheus-operator/go.mod does not require $mod $PROMETHEUS_OPERATOR_VERSION"
				exit 1
			}
			# The version, as upstream's Makefile sets it, names the config
			# reloader image the operator puts into Prometheus pods.
			go build -ldflags "-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_OPERATOR_VERSION#v}" \
				-o "$dir.tmp/operator" "$mod/cmd/operator"
			# After the build, so that the module is downloaded.
			src="$(go list -m -f '{{.Dir}}' "$mod")"
			cp "$src"/example/prometheus-operator-crd/*.yaml "$dir.tmp/crds/"
			chmod 644 "$dir.tmp"/crds/*.yaml
		)
		rm -rf "$dir" && mv "$dir.tmp" "$dir"
	fi
	echo "$dir"
}

# build_kueue: the Kueue manager (go install of its cmd/kueue, as upstream
# documents it) and, from the same module version, the manifests e2e needs to
# run it as a local process: config/crd (the CRD bases), config/crd-patches
# (the conversion-webhook patches kustomize would apply) and
# config/webhook/manifests.yaml (the admission webhook configurations).
build_kueue() {
	local dir="$root/kueue-$KUEUE_VERSION" mod="sigs.k8s.io/kueue"
	if [[ ! -x "$dir/kueue" || ! -s "$dir/config/webhook/manifests.yaml" ]]; then
		log "building kueue $KUEUE_VERSION (once, about 3 minutes; cached in $dir)"
		rm -rf "$dir.tmp" && mkdir -p "$dir.tmp/config/crd" "$dir.tmp/config/crd-patches" "$dir.tmp/config/webhook"
		GOBIN="$dir.tmp" go install "$mod/cmd/kueue@$KUEUE_VERSION"
		local src
		src="$(go mod download -json "$mod@$KUEUE_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
		[[ -d "$src/config/components" ]] || { log "kueue module source not found"; exit 1; }
		cp "$src"/config/components/crd/bases/*.yaml "$dir.tmp/config/crd/"
		cp "$src"/config/components/crd/patches/*.yaml "$dir.tmp/config/crd-patches/" 2>/dev/null || true
		cp "$src"/config/components/webhook/manifests.yaml "$dir.tmp/config/webhook/"
		chmod -R u+w,go+r "$dir.tmp/config"
		rm -rf "$dir" && mv "$dir.tmp" "$dir"
	fi
	echo "$dir"
}

# module_dir MODULE VERSION: the module's source in the module cache.
module_dir() {
	go mod download -json "$1@$2" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

# build_anchor NAME VERSION PKG MODULE CRDDIR CRD...: an operator that
# `make bench` compares Loom with, built from source as upstream documents
# it (go install of its main package) into root/NAME-VERSION, and the named
# CRDs (file names or globs) of the same module version from CRDDIR copied
# into crds/ next to the binary.
build_anchor() {
	local name="$1" version="$2" pkg="$3" mod="$4" crddir="$5" dir="$root/$1-$2"
	shift 5
	if [[ ! -x "$dir/$name" || ! -d "$dir/crds" ]]; then
		log "building $name $version (once, a few minutes; cached in $dir)"
		rm -rf "$dir.tmp" && mkdir -p "$dir.tmp/crds"
		GOBIN="$dir.tmp" go install "$pkg@$version"
		local src f
		src="$(module_dir "$mod" "$version")"
		[[ -d "$src/$crddir" ]] || { log "$mod $version: no $crddir"; exit 1; }
		# shellcheck disable=SC2086 # $f may be a glob
		for f in "$@"; do cp "$src/$crddir/"$f "$dir.tmp/crds/"; done
		chmod -R u+w,go+r "$dir.tmp/crds"
		rm -rf "$dir" && mv "$dir.tmp" "$dir"
	fi
	echo "$dir"
}

# build_kuberay: KubeRay's operator (its main package is the module root;
# the binary is named after it) and its three CRDs: it exits at start when
# the RayJob or RayService CRD is missing.
build_kuberay() {
	local mod=github.com/ray-project/kuberay/ray-operator
	build_anchor ray-operator "$KUBERAY_VERSION" "$mod" "$mod" config/crd/bases \
		ray.io_rayclusters.yaml ray.io_rayjobs.yaml ray.io_rayservices.yaml
}

# build_training_operator: Kubeflow's Training Operator (v1) and its job
# CRDs (without the directory's kustomization.yaml).
build_training_operator() {
	local mod=github.com/kubeflow/training-operator
	build_anchor training-operator.v1 "$TRAINING_OPERATOR_VERSION" "$mod/cmd/training-operator.v1" "$mod" manifests/base/crds \
		'kubeflow.org_*.yaml'
}

# One build at a time per cache: two runs building the same tool (make
# targets in parallel, two checkouts) would share one .tmp directory.
mkdir -p "$root"
if command -v flock >/dev/null; then
	exec 9>"$root/.lock"
	flock 9
fi

all=(kube kwok helm controller-gen golangci-lint prometheus-operator kueue kuberay training-operator)
[[ $# -gt 0 ]] || set -- "${all[@]}"
for t in "$@"; do
	case "$t" in
	kube) build_kube ;;
	kwok) kwok_dir="$(install_tool kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok)"; kwok_stages "$kwok_dir"; echo "$kwok_dir" ;;
	helm) install_tool helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm ;;
	controller-gen) install_tool controller-gen "$CONTROLLER_TOOLS_VERSION" sigs.k8s.io/controller-tools/cmd/controller-gen ;;
	golangci-lint) install_tool golangci-lint "$GOLANGCI_LINT_VERSION" github.com/golangci/golangci-lint/v2/cmd/golangci-lint ;;
	prometheus-operator) build_prometheus_operator ;;
	kueue) build_kueue ;;
	kuberay) build_kuberay ;;
	training-operator) build_training_operator ;;
	*) log "unknown tool $t (known: ${all[*]})"; exit 2 ;;
	esac
done
