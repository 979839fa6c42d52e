#!/usr/bin/env bash
# Builds the release of VERSION into DIST, laid out as HashiCorp's releases:
#   <product>_<version>_linux_<arch>.zip   the binary, LICENSE.txt and THIRD_PARTY_NOTICES.txt,
#                                          at the top (scripts/notices: every module linked in)
#   <product>_<pkgversion>-1_<arch>.deb    Debian's naming (amd64, arm64)
#   <product>-<pkgversion>-1.<arch>.rpm    RPM's naming (x86_64, aarch64)
#   <product>_<version>_SHA256SUMS         of the product's files above
#   SHA256SUMS                             of every file above
#   <each SHA256SUMS>.sig                  its detached GPG signature, with RELEASE_GPG_KEY
# (pkgversion: a pre-release's "-" becomes "~", which both order before the
# release.)
# Reproducible: the same commit gives the same bytes. Binaries are built with
# -trimpath, no build id and no VCS stamp; every timestamp (zip entries,
# package files and headers) is the commit's time, SOURCE_DATE_EPOCH.
#
# Environment (all optional but VERSION):
#   VERSION     x.y.z (a pre-release suffix as in 1.2.0-rc.1 is kept)
#   DIST        output directory (default dist); emptied first
#   PLATFORMS   default "linux/amd64 linux/arm64"
#   PRODUCTS    default "nomad-device-gpu gpu-broker"
#   FORMATS     default "zip deb rpm"
#   RELEASE_GPG_KEY  the GPG key (id, fingerprint or e-mail, in GNUPGHOME's keyring)
#               that signs each SHA256SUMS file; unset: no signature, and it says so
set -euo pipefail
cd "$(dirname "$0")/.."

NFPM=github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2
VERSION=${VERSION:-}
DIST=${DIST:-dist}
PLATFORMS=${PLATFORMS:-linux/amd64 linux/arm64}
PRODUCTS=${PRODUCTS:-nomad-device-gpu gpu-broker}
FORMATS=${FORMATS:-zip deb rpm}
die() { printf 'release: %s\n' "$*" >&2; exit 1; }

[[ "$VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$ ]] ||
  die "VERSION must be x.y.z (or x.y.z-pre), got '${VERSION}': make release VERSION=0.2.0"
for cmd in git zip sha256sum; do
  command -v "$cmd" >/dev/null || die "$cmd is missing (Debian: apt-get install $cmd)"
done
COMMIT=$(git rev-parse HEAD)
# Uncommitted changes would be in the binaries but not in the commit named.
[ -z "$(git status --porcelain --untracked-files=no)" ] || [ -n "${RELEASE_DIRTY:-}" ] ||
  die "the tree has uncommitted changes; commit them (or set RELEASE_DIRTY=1 for a local try)"
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
export TZ=UTC # zip stores local time
# Fixed, so that the compile (and its cache) is the same everywhere.
export CGO_CFLAGS=-Wno-deprecated-declarations

rm -rf "$DIST"
mkdir -p "$DIST"
DIST=$(cd "$DIST" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# cc ARCH: the C compiler for the plugin's cgo (go-nvml loads libnvidia-ml
# with dlopen); the broker is pure Go.
cc() {
  case "$1" in
    amd64) [ "$(go env GOHOSTARCH)" = amd64 ] && echo gcc || echo x86_64-linux-gnu-gcc ;;
    arm64) [ "$(go env GOHOSTARCH)" = arm64 ] && echo gcc || echo aarch64-linux-gnu-gcc ;;
    *) die "no C compiler known for $1" ;;
  esac
}

# Every C compiler the plugin's builds need, before anything is built: a
# missing cross-compiler is installed where apt-get can (as root), or named.
if [[ " $PRODUCTS " == *" nomad-device-gpu "* ]]; then
  for platform in $PLATFORMS; do
    compiler=$(cc "${platform#*/}")
    command -v "$compiler" >/dev/null && continue
    pkg="gcc-${compiler%-gcc}"
    [ "$compiler" = gcc ] && pkg=gcc
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      printf 'release: installing %s for nomad-device-gpu on %s\n' "$pkg" "$platform" >&2
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >&2
    fi
    command -v "$compiler" >/dev/null ||
      die "$compiler is missing for nomad-device-gpu on $platform (Debian: apt-get install $pkg); nothing was built"
  done
fi

# rpmarch ARCH: RPM's name of a Go architecture.
rpmarch() {
  case "$1" in
    amd64) echo x86_64 ;;
    arm64) echo aarch64 ;;
    *) die "no RPM architecture known for $1" ;;
  esac
}

# nfpm, a build tool at a pinned version (not a dependency of the binaries),
# built once per release (from Go's cache after the first).
if [[ " $FORMATS " == *" deb "* || " $FORMATS " == *" rpm "* ]]; then
  GOBIN="$work/bin" go install "$NFPM"
fi
go build -o "$work/bin/notices" ./scripts/notices
if [ -n "${RELEASE_GPG_KEY:-}" ]; then
  command -v gpg >/dev/null || die "gpg is missing to sign with RELEASE_GPG_KEY (Debian: apt-get install gnupg)"
fi

for platform in $PLATFORMS; do
  os=${platform%/*} arch=${platform#*/}
  [ "$os" = linux ] || die "only linux is released, not $platform"
  for product in $PRODUCTS; do
    out="$work/$arch/$product"
    mkdir -p "$(dirname "$out")"
    cgo=0 compiler=gcc cflags=$CGO_CFLAGS tags="" extld=""
    if [ "$product" = nomad-device-gpu ]; then
      # glibc 2.17 or later: scripts/plugin-flags.sh says how.
      cgo=1 compiler=$(cc "$arch")
      { read -r more; read -r tags; read -r extld; } < <(./scripts/plugin-flags.sh)
      cflags="$CGO_CFLAGS $more"
    fi
    printf 'release: %s %s %s\n' "$product" "$VERSION" "$platform" >&2
    CGO_ENABLED=$cgo CC=$compiler CGO_CFLAGS=$cflags GOOS=$os GOARCH=$arch go build -trimpath -buildvcs=false -tags "$tags" \
      -ldflags "-s -w -buildid= -X github.com/nomad-gpu/nomad-gpu/internal/version.Version=$VERSION -X github.com/nomad-gpu/nomad-gpu/internal/version.Commit=$COMMIT $extld" \
      -o "$out" "./cmd/$product"
    chmod 0755 "$out"
    touch -d "@$SOURCE_DATE_EPOCH" "$out"
    cp LICENSE "$(dirname "$out")/LICENSE.txt"
    "$work/bin/notices" "$out" >"$(dirname "$out")/THIRD_PARTY_NOTICES.txt"
    touch -d "@$SOURCE_DATE_EPOCH" "$(dirname "$out")/LICENSE.txt" "$(dirname "$out")/THIRD_PARTY_NOTICES.txt"
    pkgversion=${VERSION/-/\~}
    for format in $FORMATS; do
      case "$format" in
        zip) name="${product}_${VERSION}_${os}_${arch}.zip" ;;
        deb) name="${product}_${pkgversion}-1_${arch}.deb" ;;
        rpm) name="${product}-${pkgversion}-1.$(rpmarch "$arch").rpm" ;;
        *) die "unknown format $format (zip, deb or rpm)" ;;
      esac
      case "$format" in
        zip) (cd "$(dirname "$out")" && zip -q -X -D "$DIST/$name" "$product" LICENSE.txt THIRD_PARTY_NOTICES.txt) ;;
        deb | rpm)
          sed -e "s|\${BIN}|$out|" -e "s|\${NOTICES}|$(dirname "$out")/THIRD_PARTY_NOTICES.txt|" \
            -e "s|\${VERSION}|$VERSION|" -e "s|\${ARCH}|$arch|" \
            "packaging/$product.nfpm.yaml" >"$work/nfpm.yaml"
          "$work/bin/nfpm" package -f "$work/nfpm.yaml" -p "$format" -t "$DIST/$name" >&2 ;;
      esac
    done
  done
done
shopt -s nullglob
cd "$DIST"
for product in $PRODUCTS; do
  files=("${product}"_*.zip "${product}"_*.deb "${product}"-*.rpm)
  sha256sum -- "${files[@]}" >"${product}_${VERSION}_SHA256SUMS"
done
files=(*.zip *.deb *.rpm)
sha256sum -- "${files[@]}" >SHA256SUMS
# Signed as HashiCorp signs its releases: a detached signature beside each
# SHA256SUMS file, which gpg --verify checks (docs/install.md).
if [ -n "${RELEASE_GPG_KEY:-}" ]; then
  for sums in *SHA256SUMS; do
    gpg --batch --yes --local-user "$RELEASE_GPG_KEY" --detach-sign --output "$sums.sig" "$sums" ||
      die "gpg could not sign $sums with RELEASE_GPG_KEY=$RELEASE_GPG_KEY"
  done
else
  printf 'release: RELEASE_GPG_KEY is unset: the SHA256SUMS files are not signed\n' >&2
fi
cd - >/dev/null
cat "$DIST/SHA256SUMS"
