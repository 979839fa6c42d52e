#!/usr/bin/env bash
# Builds the real Nomad and Consul agents used by tests and the demo, and OpenTofu
# for terraform/, from the Go module proxy (MPL-2.0 releases), once per machine,
# into TOOLS_DIR; and unpacks an older glibc (Debian 11's) that the released
# plugin is run on.
# Idempotent: a binary that already reports the wanted version is kept.
set -euo pipefail

NOMAD_VERSION=1.6.3
NOMAD_API=v0.0.0-20231030125810-e0497bff1437 # the api module at the v1.6.3 commit
CONSUL_VERSION=1.16.3
CONSUL_SUBMODULES="api@v1.25.1 envoyextensions@v0.4.1 proto-public@v0.4.1 sdk@v0.14.1 troubleshoot@v0.3.1"
TOFU_VERSION=1.12.6
OLD_GLIBC=2.31 # Debian 11 (bullseye), RHEL 8's 2.28 and Ubuntu 20.04's 2.31 are of its age

TOOLS_DIR=${TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nomad-gpu/tools}
mkdir -p "$TOOLS_DIR/bin"
log() { printf 'tools: %s\n' "$*" >&2; }

# has_version BIN WANT: the binary exists and its "version" output names WANT.
# (Its output is read whole: under pipefail, `| head -n1` could end the binary
# with SIGPIPE and make a present tool look absent, rebuilding it; and tofu
# prints CLI-configuration warnings before its version.)
has_version() {
  local out
  [ -x "$1" ] && out=$("$1" version 2>/dev/null) && [[ "$out" == *"v$2"* ]]
}

# fetch MODULE@VERSION DEST: copies a module from the proxy into a writable DEST.
fetch() {
  local dir
  dir=$(go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -n "$dir" ] || { log "go mod download $1 gave no directory"; return 1; }
  rm -rf "$2"; mkdir -p "$(dirname "$2")"
  cp -r "$dir" "$2"; chmod -R u+w "$2"
}

require_mpl() {
  if ! grep -q 'Mozilla Public License' "$1/LICENSE"; then
    log "refusing to build $1: its LICENSE is not MPL-2.0"; exit 1
  fi
}

build_nomad() {
  if has_version "$TOOLS_DIR/bin/nomad" "$NOMAD_VERSION"; then log "nomad v$NOMAD_VERSION present"; return; fi
  log "building nomad v$NOMAD_VERSION (a few minutes, once per machine)"
  local src="$TOOLS_DIR/src/nomad"
  fetch "github.com/hashicorp/nomad@v$NOMAD_VERSION" "$src"
  require_mpl "$src"
  fetch "github.com/hashicorp/nomad/api@$NOMAD_API" "$src/api"
  (cd "$src" && go build -trimpath -tags codegen_generated -o "$TOOLS_DIR/bin/nomad.tmp" .)
  mv "$TOOLS_DIR/bin/nomad.tmp" "$TOOLS_DIR/bin/nomad"
  rm -rf "$src"
  has_version "$TOOLS_DIR/bin/nomad" "$NOMAD_VERSION"
}

build_consul() {
  if has_version "$TOOLS_DIR/bin/consul" "$CONSUL_VERSION"; then log "consul v$CONSUL_VERSION present"; return; fi
  log "building consul v$CONSUL_VERSION (a few minutes, once per machine)"
  local src="$TOOLS_DIR/src/consul" sub
  fetch "github.com/hashicorp/consul@v$CONSUL_VERSION" "$src"
  require_mpl "$src"
  for sub in $CONSUL_SUBMODULES; do
    GONOSUMDB=github.com/hashicorp/consul/envoyextensions \
      fetch "github.com/hashicorp/consul/$sub" "$src/${sub%@*}"
  done
  (cd "$src" && GONOSUMDB=github.com/hashicorp/consul/envoyextensions \
    go build -trimpath -o "$TOOLS_DIR/bin/consul.tmp" .)
  mv "$TOOLS_DIR/bin/consul.tmp" "$TOOLS_DIR/bin/consul"
  rm -rf "$src"
  has_version "$TOOLS_DIR/bin/consul" "$CONSUL_VERSION"
}

# keep_nomad_routes keeps the files of Nomad's source that say which HTTP
# routes it serves: the broker's route table is tested against them
# (broker/server TestEveryNomadRouteIsClassified), read, never built in.
keep_nomad_routes() {
  local dest="$TOOLS_DIR/nomad-routes/v$NOMAD_VERSION" dir f
  if [ -f "$dest/http.go" ]; then log "nomad v$NOMAD_VERSION routes present"; return; fi
  dir=$(go mod download -json "github.com/hashicorp/nomad@v$NOMAD_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -n "$dir" ] || { log "go mod download nomad@v$NOMAD_VERSION gave no directory"; return 1; }
  mkdir -p "$dest"
  for f in http.go job_endpoint.go deployment_endpoint.go; do cp "$dir/command/agent/$f" "$dest/$f.tmp"; done
  cp "$dir/LICENSE" "$dest/LICENSE"
  for f in job_endpoint.go deployment_endpoint.go http.go; do mv "$dest/$f.tmp" "$dest/$f"; done
  chmod -R u+w "$dest"
}

# OpenTofu (MPL-2.0) tests terraform/. Its go.mod replaces hcl, so `go install`
# refuses it; it is built from a copy of its module like the agents.
build_tofu() {
  # The machine's TF_CLI_CONFIG_FILE may name a missing file: tofu then warns
  # before its version line.
  export TF_CLI_CONFIG_FILE=/dev/null
  if has_version "$TOOLS_DIR/bin/tofu" "$TOFU_VERSION"; then log "tofu v$TOFU_VERSION present"; return; fi
  log "building tofu v$TOFU_VERSION (a few minutes, once per machine)"
  local src="$TOOLS_DIR/src/opentofu"
  fetch "github.com/opentofu/opentofu@v$TOFU_VERSION" "$src"
  require_mpl "$src"
  (cd "$src" && CGO_ENABLED=0 go build -trimpath -ldflags "-X github.com/opentofu/opentofu/version.dev=no" \
    -o "$TOOLS_DIR/bin/tofu.tmp" ./cmd/tofu)
  mv "$TOOLS_DIR/bin/tofu.tmp" "$TOOLS_DIR/bin/tofu"
  rm -rf "$src"
  has_version "$TOOLS_DIR/bin/tofu" "$TOFU_VERSION"
}

# old_glibc unpacks Debian 11's libc6 (glibc 2.31, before 2.34 moved libdl
# and libpthread into libc) for amd64, checked against the suite's package
# index: packaging's test runs the released plugin on it.
old_glibc() {
  local dest="$TOOLS_DIR/glibc-$OLD_GLIBC" index deb sum work
  if [ -x "$dest/lib/x86_64-linux-gnu/ld-$OLD_GLIBC.so" ]; then log "glibc $OLD_GLIBC present"; return; fi
  for cmd in curl xz dpkg-deb sha256sum; do
    command -v "$cmd" >/dev/null || { log "$cmd is missing for glibc $OLD_GLIBC (Debian: apt-get install $cmd)"; return 1; }
  done
  log "unpacking glibc $OLD_GLIBC (Debian 11's libc6)"
  work=$(mktemp -d)
  curl -fsSL -o "$work/Packages.xz" https://deb.debian.org/debian/dists/bullseye/main/binary-amd64/Packages.xz
  index=$(xz -dc "$work/Packages.xz" | awk '/^Package: libc6$/ {p = 1} p && /^(Version|Filename|SHA256):/ {print $2} p && /^$/ {p = 0}')
  read -r version deb sum <<<"$(echo $index)"
  [[ "$version" == "$OLD_GLIBC"-* ]] || { log "bullseye's libc6 is $version, not $OLD_GLIBC"; rm -rf "$work"; return 1; }
  curl -fsSL -o "$work/libc6.deb" "https://deb.debian.org/debian/$deb"
  echo "$sum  $work/libc6.deb" | sha256sum -c --quiet || { log "libc6 $version: checksum mismatch"; rm -rf "$work"; return 1; }
  dpkg-deb -x "$work/libc6.deb" "$work/root"
  rm -rf "$dest"; mv "$work/root" "$dest"; rm -rf "$work"
}

case "${1:-all}" in
  nomad) build_nomad; keep_nomad_routes ;;
  consul) build_consul ;;
  tofu) build_tofu ;;
  glibc) old_glibc ;;
  all) build_nomad; keep_nomad_routes; build_consul; build_tofu; old_glibc ;;
  dir) echo "$TOOLS_DIR" ;;
  *) log "usage: $0 [all|nomad|consul|tofu|glibc|dir]"; exit 2 ;;
esac
