#!/usr/bin/env bash
# Local demo cluster on loopback: Consul, one Nomad server and two Nomad clients
# with 8 simulated H100 GPUs each (nomad-device-gpu, fake backend).
#   scripts/demo.sh up     start it and print the GPU inventory
#   scripts/demo.sh down   stop everything and remove what it left
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO_DIR=${DEMO_DIR:-$PWD/.demo}
TOOLS_DIR=${TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nomad-gpu/tools}
NOMAD=$TOOLS_DIR/bin/nomad
CONSUL=$TOOLS_DIR/bin/consul
export NOMAD_ADDR=http://127.0.0.1:4646
DENYLIST=env_aws,env_gce,env_azure,env_digitalocean

log() { printf 'demo: %s\n' "$*" >&2; }

# start NAME CMD...: runs CMD in its own session, output to NAME.log, pid to NAME.pid.
start() {
  local name=$1; shift
  setsid "$@" >"$DEMO_DIR/$name.log" 2>&1 < /dev/null &
  echo $! >"$DEMO_DIR/$name.pid"
}

wait_for() {
  local what=$1 tries=$2; shift 2
  for _ in $(seq "$tries"); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
  log "timed out waiting for $what; see $DEMO_DIR/*.log"; return 1
}

client_config() { # NAME HTTP RPC SERF
  cat <<HCL
name                 = "$1"
data_dir             = "$DEMO_DIR/$1"
plugin_dir           = "$DEMO_DIR/plugins"
bind_addr            = "127.0.0.1"
disable_update_check = true
ports { http = $2  rpc = $3  serf = $4 }
advertise { http = "127.0.0.1:$2"  rpc = "127.0.0.1:$3"  serf = "127.0.0.1:$4" }
client {
  enabled       = true
  servers       = ["127.0.0.1:4647"]
  cgroup_parent = "/nomad-gpu-demo-$1"
  options { "fingerprint.denylist" = "$DENYLIST" }
}
consul { address = "127.0.0.1:8500" }
plugin "raw_exec" { config { enabled = true } }
plugin "nomad-device-gpu" {
  config {
    backend            = "fake"
    fingerprint_period = "5s"
    health_recovery    = "30s"
    fake {
      count      = 8
      model      = "NVIDIA H100 80GB HBM3"
      id_prefix  = "$1"
      state_file = "$DEMO_DIR/$1-gpu-state.json"
    }
  }
}
HCL
}

up() {
  [ -x "$NOMAD" ] && [ -x "$CONSUL" ] || { log "run 'make tools' first"; exit 1; }
  if [ -f "$DEMO_DIR/nomad-server.pid" ] && kill -0 "$(cat "$DEMO_DIR/nomad-server.pid")" 2>/dev/null; then
    log "already running; 'make demo-down' stops it"; exit 1
  fi
  mkdir -p "$DEMO_DIR/plugins"
  cp bin/nomad-device-gpu "$DEMO_DIR/plugins/"

  start consul "$CONSUL" agent -dev -bind 127.0.0.1 -client 127.0.0.1 -advertise 127.0.0.1 \
    -dns-port -1 -hcl 'disable_update_check = true'
  wait_for "consul" 30 curl -sf http://127.0.0.1:8500/v1/status/leader

  cat >"$DEMO_DIR/server.hcl" <<HCL
name                 = "server"
data_dir             = "$DEMO_DIR/server"
bind_addr            = "127.0.0.1"
disable_update_check = true
advertise { http = "127.0.0.1:4646"  rpc = "127.0.0.1:4647"  serf = "127.0.0.1:4648" }
server { enabled = true  bootstrap_expect = 1 }
consul { address = "127.0.0.1:8500" }
HCL
  start nomad-server "$NOMAD" agent -config "$DEMO_DIR/server.hcl"
  client_config client-1 4656 4657 4658 >"$DEMO_DIR/client-1.hcl"
  client_config client-2 4666 4667 4668 >"$DEMO_DIR/client-2.hcl"
  start nomad-client-1 "$NOMAD" agent -config "$DEMO_DIR/client-1.hcl"
  start nomad-client-2 "$NOMAD" agent -config "$DEMO_DIR/client-2.hcl"
  wait_for "two Nomad clients with GPUs" 90 two_gpu_nodes
  inventory
  cat <<TXT

Demo cluster is up: Nomad $NOMAD_ADDR, Consul http://127.0.0.1:8500.
  export NOMAD_ADDR=$NOMAD_ADDR
  nomad node status -verbose <node>     GPUs, attributes, health
Make a GPU fail (recovers 30s after the file no longer says so):
  echo '{"<GPU UUID>": {"healthy": false, "health_description": "XID 79"}}' > $DEMO_DIR/client-1-gpu-state.json
Stop everything: make demo-down
TXT
}

two_gpu_nodes() {
  [ "$("$NOMAD" node status -json 2>/dev/null | grep -c '"Status": "ready"')" -ge 2 ] || return 1
  for id in $("$NOMAD" node status -quiet); do
    "$NOMAD" node status -verbose "$id" | grep -q 'nvidia/gpu' || return 1
  done
}

inventory() {
  echo "GPU inventory:"
  for id in $("$NOMAD" node status -quiet); do
    "$NOMAD" node status -verbose "$id" | awk -v node="$id" '
      /^Name/ { name = $3 }
      /^Device Resource Utilization/ { devices = 1; next }
      devices && /^$/ { devices = 0 }
      devices { print "  " name ": " $0 }'
    "$NOMAD" node status -verbose "$id" | sed 's/\[bold\]//; s/\[reset\]//' |
      awk '/^Device Group Attributes/ { on = 1; next } on && /^$/ { on = 0 } on' | sed 's/^/    /'
  done
}

down() {
  for name in nomad-client-1 nomad-client-2; do
    port=$([ "$name" = nomad-client-1 ] && echo 4656 || echo 4666)
    # Release the clients' allocations (and their mounts) before they stop.
    curl -sf -X PUT "http://127.0.0.1:$port/v1/client/gc" >/dev/null 2>&1 || true
  done
  for name in nomad-client-1 nomad-client-2 nomad-server consul; do
    pidfile="$DEMO_DIR/$name.pid"
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill -INT "$pid" 2>/dev/null || true
    for _ in $(seq 15); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$pidfile"
  done
  if [ -d "$DEMO_DIR" ]; then
    grep -o " $DEMO_DIR/[^ ]*" /proc/self/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    rm -rf "$DEMO_DIR"
  fi
  log "stopped; nothing left running or mounted"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
