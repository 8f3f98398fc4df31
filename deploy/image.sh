#!/usr/bin/env bash
# Builds the kube-dispatch image without a registry and without pulling a base image: static
# (musl) optimised binaries of the dispatcher, the load balancer, kdctl and the example
# controllers (configmap-hasher, and the ported bundles and mirrors controllers) in a root
# filesystem of their own, built from deploy/Dockerfile (FROM scratch, user 65532, nothing else
# in it) by buildah from the distribution's packages, or by docker. The same Dockerfile and
# context serve both, so both give the same layout:
#
#   /usr/local/bin/kube-dispatch-dispatcher   (the entrypoint)
#   /usr/local/bin/kube-dispatch-loadbalancer
#   /usr/local/bin/kdctl
#   /usr/local/bin/configmap-hasher
#   /usr/local/bin/ported-controllers         (controller-sdk/examples/ported)
#   /etc/passwd, /etc/group                   (nonroot, 65532)
#
# Usage: deploy/image.sh [--go-example] [--tag NAME:TAG | --release] [--profile NAME] [--output ARCHIVE] [--builder buildah|docker]
#   --go-example  the Go SDK's example controllers instead (static Go binaries, CGO off): the
#              image kube-dispatch-go-hasher:dev, /usr/local/bin/configmap-hasher-go its
#              entrypoint (controller-sdk/go/examples/configmap-hasher), and beside it
#              /usr/local/bin/ported-controllers-go (controller-sdk/go/examples/ported, the
#              Bundle and Mirror controllers) (deploy/go-hasher.Dockerfile)
#   --tag      the image name (default kube-dispatch:dev; a bare name is docker.io/library/...)
#   --release  tag it with the version and the commit instead: kube-dispatch:0.1.0-<commit>
#              (-dirty appended with uncommitted changes); either way the image carries them
#              as the OCI labels org.opencontainers.image.version and .revision, and the
#              dispatcher's, the load balancer's and kdctl's --version name the commit
#   --profile  the cargo profile of the binaries (default dist: release with fat link-time
#              optimisation and one codegen unit, code 10 to 15 % smaller and 1.5 to 2.5 MiB
#              less resident per process, for a link of minutes per binary on 2 cores;
#              `release` links in seconds and is what `make e2e`'s image uses; `e2e`,
#              unoptimised, is `make test`'s; dev, test and bench are refused). --release names
#              the tag, not the profile.
#   --output   where buildah writes the OCI archive (default target/image/kube-dispatch-dev.oci.tar,
#              under CARGO_TARGET_DIR when set);
#              load it with `ctr images import`, `podman load`, or `skopeo copy oci-archive:...`
#   --builder  buildah (default; installed from the distribution's packages when missing and
#              run as root) or docker (tags the image in the local engine; no archive)
#   --binaries-only  build the binaries the image would hold (or, with --go-example, the Go
#              example's), with their prerequisites, and stop: `make test` builds them in the
#              background while other steps run, so that its end-to-end step finds them built
# Also, for other images built the same way (tests/node/node.sh's pause image):
#   deploy/image.sh --build-only --context DIR --file DOCKERFILE --tag NAME:TAG --output ARCHIVE
#
# The binaries are linked statically against musl: the rustup target x86_64-unknown-linux-musl
# and musl-gcc (Debian's musl-tools) are installed when missing.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tag=
release=false
go_example=false
output=
builder=buildah
profile=dist
build_only=false
binaries_only=false
context=
file=$root/deploy/Dockerfile
target=x86_64-unknown-linux-musl
# Where cargo builds (CARGO_TARGET_DIR, as cargo reads it), and where the image goes.
target_dir=${CARGO_TARGET_DIR:-$root/target}

log() { printf 'image: %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}
usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
  exit 2
}

while [[ $# -gt 0 ]]; do
  case $1 in
    --tag) tag=${2:?--tag needs a value}; shift 2 ;;
    --output) output=${2:?--output needs a value}; shift 2 ;;
    --builder) builder=${2:?--builder needs a value}; shift 2 ;;
    --profile) profile=${2:?--profile needs a value}; shift 2 ;;
    --build-only) build_only=true; shift ;;
    --binaries-only) binaries_only=true; shift ;;
    --go-example) go_example=true; file=$root/deploy/go-hasher.Dockerfile; shift ;;
    --release) release=true; shift ;;
    --context) context=${2:?--context needs a value}; shift 2 ;;
    --file) file=${2:?--file needs a value}; shift 2 ;;
    -h | --help) usage ;;
    *) log "unknown argument: $1"; usage ;;
  esac
done
[[ $builder == buildah || $builder == docker ]] || die "--builder is buildah or docker, not $builder"
# cargo writes dev and test into target/debug and bench into target/release: not where the
# binaries are looked for, and not what an image should carry.
case $profile in
  dev | test | bench) die "--profile $profile: give dist (the default), release, or a profile of your own" ;;
esac
# The release and the commit built: the workspace's version, the checkout's commit (with -dirty
# when it has uncommitted changes).
version=$("$root/deploy/version.sh")
# safe.directory: run as root (buildah) on a checkout another user owns, git would refuse.
git=(git -c "safe.directory=$root" -C "$root")
commit=$("${git[@]}" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [[ $commit != unknown ]] && [[ -n $("${git[@]}" status --porcelain 2>/dev/null) ]]; then
  commit+=-dirty
fi
if [[ $release == true ]]; then
  [[ -z $tag ]] || die "--release names the tag itself: give --tag or --release, not both"
  [[ $commit != unknown ]] || die "--release needs the commit: $root is not a git checkout git can read"
  name=kube-dispatch
  [[ $go_example == true ]] && name=kube-dispatch-go-hasher
  tag=$name:$version-$commit
fi
if [[ -z $tag ]]; then
  if [[ $go_example == true ]]; then tag=kube-dispatch-go-hasher:dev; else tag=kube-dispatch:dev; fi
fi

# A bare name means Docker Hub's library, as containerd and the kubelet read it.
if [[ $tag != */* ]]; then
  full_tag=docker.io/library/$tag
elif [[ ${tag%%/*} == *.* || ${tag%%/*} == *:* || ${tag%%/*} == localhost ]]; then
  full_tag=$tag
else
  full_tag=docker.io/$tag
fi

install_packages() {
  [[ $# -eq 0 ]] && return 0
  command -v apt-get >/dev/null && [[ $(id -u) == 0 ]] ||
    die "$* missing: install them with your package manager (Debian: apt-get install $*)"
  log "installing $* from the distribution's packages"
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 install -y --no-install-recommends "$@" >/dev/null ||
    die "apt-get install $* failed"
}

# What the static binaries need: musl-gcc and the rustup target.
prerequisites() {
  local want=()
  command -v musl-gcc >/dev/null || want+=(musl-tools)
  install_packages "${want[@]}"
  if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    log "adding the rustup target $target"
    rustup target add "$target" >/dev/null
  fi
}

# The static binaries, in target/x86_64-unknown-linux-musl/<profile>.
build_binaries() {
  prerequisites
  log "building the static binaries (cargo --profile $profile --target $target), version $version"
  (
    cd "$root"
    # --version of every binary names the commit.
    export KD_GIT_COMMIT=$commit
    cargo build --profile "$profile" --locked --quiet --target "$target" \
      -p kube-dispatch-dispatcher -p kube-dispatch-loadbalancer -p kube-dispatch-kdctl --bins
    cargo build --profile "$profile" --locked --quiet --target "$target" \
      -p kube-dispatch-controller --example configmap_hasher --example ported
  )
}

# The static binaries and the root filesystem, in target/image/context.
make_context() {
  build_binaries
  local out=$target_dir/$target/$profile
  context=$target_dir/image/context
  rm -rf "$context"
  mkdir -p "$context/rootfs/usr/local/bin" "$context/rootfs/etc"
  install -m 0755 "$out/kube-dispatch-dispatcher" "$out/kube-dispatch-loadbalancer" "$out/kdctl" \
    "$context/rootfs/usr/local/bin/"
  install -m 0755 "$out/examples/configmap_hasher" "$context/rootfs/usr/local/bin/configmap-hasher"
  install -m 0755 "$out/examples/ported" "$context/rootfs/usr/local/bin/ported-controllers"
  # Symbols off (backtraces keep function names only where panics print them): a third the size.
  strip "$context"/rootfs/usr/local/bin/*
  users "$context/rootfs"
  static "$context"
}

# /etc/passwd and /etc/group naming the user nonroot (65532) the images run as.
users() {
  printf '%s\n' 'root:x:0:0:root:/:/sbin/nologin' 'nonroot:x:65532:65532:nonroot:/:/sbin/nologin' \
    >"$1/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nonroot:x:65532:' >"$1/etc/group"
  chmod 0644 "$1/etc/passwd" "$1/etc/group"
}

# Fails unless every binary of the context is static.
static() {
  local bin
  for bin in "$1"/rootfs/usr/local/bin/*; do
    # A static binary has no interpreter; one that needs ld.so would not start from scratch.
    if readelf -l "$bin" | grep -q 'Requesting program interpreter'; then
      die "$bin is dynamically linked"
    fi
  done
}

# The Go examples' context, in target/image/go-context: static binaries (no cgo, so no libc).
make_go_context() {
  command -v go >/dev/null || die "go is needed to build the Go example"
  context=$target_dir/image/go-context
  rm -rf "$context"
  mkdir -p "$context/rootfs/usr/local/bin" "$context/rootfs/etc"
  log "building the Go example controllers (CGO_ENABLED=0)"
  (
    cd "$root/controller-sdk/go"
    CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' \
      -o "$context/rootfs/usr/local/bin/configmap-hasher-go" ./examples/configmap-hasher
    CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' \
      -o "$context/rootfs/usr/local/bin/ported-controllers-go" ./examples/ported
  )
  users "$context/rootfs"
  static "$context"
}

if [[ $binaries_only == true ]]; then
  if [[ $go_example == true ]]; then make_go_context; else build_binaries; fi
  log "binaries built; no image (--binaries-only)"
  exit 0
fi
if [[ $build_only == false && $go_example == true ]]; then
  make_go_context
  : "${output:=$target_dir/image/$(basename "${tag%%:*}")-${tag##*:}.oci.tar}"
elif [[ $build_only == false ]]; then
  make_context
  : "${output:=$target_dir/image/$(basename "${tag%%:*}")-${tag##*:}.oci.tar}"
fi
[[ -n $context && -d $context ]] || die "--build-only needs --context DIR"
[[ -n $output || $builder == docker ]] || die "--build-only needs --output ARCHIVE"

# kube-dispatch's images say what they hold; other images built here (--build-only) do not.
labels=()
if [[ $build_only == false ]]; then
  labels=(--label "org.opencontainers.image.version=$version" --label "org.opencontainers.image.revision=$commit")
fi
case $builder in
  docker)
    docker build -f "$file" -t "$tag" "${labels[@]}" "$context"
    log "built $tag with docker"
    ;;
  buildah)
    command -v buildah >/dev/null || install_packages buildah
    # A storage of our own (vfs: no overlay mounts, nothing system-wide), emptied afterwards.
    store=$(mktemp -d "${TMPDIR:-/tmp}/kube-dispatch-image.XXXXXX")
    trap 'buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs rm --all >/dev/null 2>&1 || true; rm -rf "$store"' EXIT
    b=(buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs)
    # --timestamp 0: the same binaries give the same image digest.
    "${b[@]}" bud --quiet --timestamp 0 --layers=false -f "$file" -t "$full_tag" "${labels[@]}" \
      "$context" >/dev/null
    mkdir -p "$(dirname "$output")"
    rm -f "$output"
    "${b[@]}" push --quiet "$full_tag" "oci-archive:$output:$full_tag" >/dev/null
    log "built $full_tag into $output ($(du -h "$output" | cut -f1))"
    echo "$output"
    ;;
esac
