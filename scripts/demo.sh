#!/usr/bin/env bash
# Local demo cluster on loopback: Consul, one Nomad server and two Nomad clients
# with 8 simulated H100 GPUs each (nomad-device-gpu, fake backend), and gpu-broker
# in front of Nomad with the example policies.
#   scripts/demo.sh up     start it, print the GPU inventory, show a borrowed job
#                          being preempted by a tenant within its guarantee
#   scripts/demo.sh down   stop everything and remove what it left
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO_DIR=${DEMO_DIR:-$PWD/.demo}
TOOLS_DIR=${TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nomad-gpu/tools}
NOMAD=$TOOLS_DIR/bin/nomad
CONSUL=$TOOLS_DIR/bin/consul
export NOMAD_ADDR=http://127.0.0.1:4646
BROKER_ADDR=http://127.0.0.1:4649
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
  # Shared by both clients, as a network filesystem would be: training
  # checkpoints (jobspecs/training.nomad.hcl).
  host_volume "checkpoints" { path = "$DEMO_DIR/checkpoints" }
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
  mkdir -p "$DEMO_DIR/plugins" "$DEMO_DIR/checkpoints"
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

  for ns in vision search research; do "$NOMAD" namespace apply -description "tenant $ns" "$ns" >/dev/null; done
  # The example policies, with rule idle-dev shortened so that the story can
  # show it: 20s idle and 10s grace instead of 30m and 5m, a pass every 5s.
  mkdir -p "$DEMO_DIR/policies"
  cp policies/*.hcl "$DEMO_DIR/policies/"
  sed -i 's/\(idle_for *= *\)"30m"/\1"20s"/; /reclaim "idle-dev"/,/^}/s/\(grace *= *\)"5m"/\1"10s"/; s/\(period *= *\)"30s"/\1"5s"/' \
    "$DEMO_DIR/policies/reclaim.hcl"
  # And the re-borrow backoff: 10s instead of 30m, so that the preempted job
  # borrows again within the demo.
  sed -i 's/\(backoff *= *\)"30m"/\1"10s"/' "$DEMO_DIR/policies/queues.hcl"
  cat >"$DEMO_DIR/broker.hcl" <<HCL
listen     = "127.0.0.1:4649"
policy_dir = "$DEMO_DIR/policies"
nomad  { address = "$NOMAD_ADDR" }
consul { address = "127.0.0.1:8500" }
audit  { path = "$DEMO_DIR/audit.log" }
HCL
  # The tour's commands as printed: nomad and consul beside gpu-broker in bin/.
  ln -sf "$NOMAD" bin/nomad
  ln -sf "$CONSUL" bin/consul
  start gpu-broker bin/gpu-broker serve -config "$DEMO_DIR/broker.hcl"
  wait_for "gpu-broker" 30 curl -sf $BROKER_ADDR/v1/gpu/usage
  wait_for "the broker to see 16 GPUs" 30 broker_sees_gpus
  scenario
  cat <<TXT

Demo cluster is up: Nomad $NOMAD_ADDR, Consul http://127.0.0.1:8500, gpu-broker $BROKER_ADDR.
  open $BROKER_ADDR/gpu/           the web UI: GPU map, queues, tenants, reclaim
  export PATH=\$PWD/bin:\$PATH NOMAD_ADDR=$BROKER_ADDR   nomad, consul, gpu-broker; submit through the broker, as users do
  nomad job run jobspecs/dev.nomad.hcl      queued: vision holds 12 of its limit of 12 GPUs
  nomad job stop -namespace vision train-borrowed   and the dev job is admitted
  gpu-broker usage | gpu-broker queue list | gpu-broker reclaim list
  nomad node status -verbose <node>        GPUs, attributes, health
Make a GPU fail (recovers 30s after the file no longer says so):
  echo '{"<GPU UUID>": {"healthy": false, "health_description": "XID 79"}}' > $DEMO_DIR/client-1-gpu-state.json
Stop everything: make demo-down
TXT
}

broker_sees_gpus() {
  # A job of 9 GPUs in one allocation is refused only once the broker knows nodes hold 8.
  curl -s -X PUT "$BROKER_ADDR/v1/validate/job" -d '{"Job":{"ID":"probe","Namespace":"vision","TaskGroups":[{"Name":"g","Count":1,
    "Tasks":[{"Name":"t","Driver":"raw_exec","Resources":{"Devices":[{"Name":"nvidia/gpu","Count":9}]}}]}]}}' |
    grep -q 'no node has more than 8'
}

# scenario: vision fills its guarantee and borrows idle GPUs; search then claims
# its guarantee, and Nomad preempts vision's borrowed job for it.
scenario() {
  echo
  echo "== vision: 2 workers x 4 GPUs, within its guarantee of 8 (training band, priority 45)"
  NOMAD_ADDR=$BROKER_ADDR "$NOMAD" job run -detach -var checkpoint_dir="$DEMO_DIR/checkpoints" \
    jobspecs/training.nomad.hcl | grep -v '^$'
  echo "== vision: 4 more GPUs, beyond its guarantee: borrowed from idle GPUs (priority 20)"
  NOMAD_ADDR=$BROKER_ADDR "$NOMAD" job run -detach -var workers=1 -var gpus_per_worker=4 \
    -var checkpoint_dir="$DEMO_DIR/checkpoints" \
    <(sed 's/job "train-resnet"/job "train-borrowed"/' jobspecs/training.nomad.hcl) | grep -v '^$'
  wait_for "vision's jobs running" 60 running vision train-borrowed
  echo "== search: 3 replicas x 2 GPUs, within its guarantee of 6 (inference band, priority 49)"
  NOMAD_ADDR=$BROKER_ADDR "$NOMAD" job run -detach jobspecs/inference.nomad.hcl | grep -v '^$'
  wait_for "search's service running" 60 running search ranker
  echo "== what Nomad did with vision's borrowed job:"
  "$NOMAD" job allocs -namespace vision train-borrowed
  wait_for "the broker to requeue the preempted job" 30 queued train-borrowed
  echo "== the broker put it back in its queue (vision is no longer charged for it):"
  bin/gpu-broker queue list -address $BROKER_ADDR
  echo
  bin/gpu-broker usage -address $BROKER_ADDR
  echo
  echo "== ana starts a dev environment and leaves it idle"
  echo "   (rule idle-dev, shortened for the demo: every GPU below 5% for 20s, then 10s of grace)"
  NOMAD_ADDR=$BROKER_ADDR "$NOMAD" job run -detach jobspecs/dev.nomad.hcl | grep -v '^$'
  wait_for "idle-dev to stop the idle dev environment" 90 reclaimed dev-env
  bin/gpu-broker reclaim list -address $BROKER_ADDR
  echo
  echo "== search stops its service: vision's preempted job, past its re-borrow backoff (10s in the demo, 30m by"
  echo "   default), leaves the queue and resumes from its checkpoint"
  NOMAD_ADDR=$BROKER_ADDR "$NOMAD" job stop -namespace search -detach ranker >/dev/null
  wait_for "train-borrowed running again" 60 running vision train-borrowed
  wait_for "train-borrowed's first line" 15 task_says resuming train-borrowed
  task_says stopping train-borrowed
  task_says resuming train-borrowed
  echo
  echo "== GPU-hours so far today, and what they cost (idle ones included):"
  bin/gpu-broker usage -address $BROKER_ADDR -from "$(date -u +%F)"
  echo
  echo "== who decided what (the audit trail, $DEMO_DIR/audit.log):"
  bin/gpu-broker audit -address $BROKER_ADDR -since 1h
  echo
  echo "== the same for Prometheus, at $BROKER_ADDR/metrics:"
  curl -s $BROKER_ADDR/metrics | grep -E '^nomadgpu_(gpus\{.*state="(allocated|free)"|tenant_gpus\{gpu_class="all",kind="used")'
}

# queued JOB: JOB waits in the broker's queue.
queued() { bin/gpu-broker queue list -address "$BROKER_ADDR" | grep -q " $1 "; }

# reclaimed JOB: a reclaim decision on JOB was carried out.
reclaimed() {
  bin/gpu-broker reclaim list -address "$BROKER_ADDR" -json | grep -q "\"job\":\"$1\"[^}]*\"state\":\"executed\""
}

running() { "$NOMAD" job allocs -namespace "$1" "$2" 2>/dev/null | grep -q ' running '; }

# task_says WORD JOB: prints (and succeeds on) the line of vision's JOB's
# train task that has WORD, from the allocation that stopped or the one running.
task_says() {
  local status=running id
  [ "$1" = stopping ] && status=complete
  id=$("$NOMAD" job allocs -namespace vision "$2" 2>/dev/null | awk -v s="$status" '$6 == s { print $1; exit }')
  [ -n "$id" ] && "$NOMAD" alloc logs -namespace vision "$id" train 2>/dev/null | grep -m1 "$1" | sed "s/^/   $2 ($id): /" | grep .
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
  # Stop every job first, so that Nomad itself stops the tasks and their cgroups.
  if curl -sf "$NOMAD_ADDR/v1/status/leader" >/dev/null 2>&1; then
    curl -s "$NOMAD_ADDR/v1/jobs?namespace=*" | grep -o '"ID":"[^"]*","ParentID":"[^"]*","Name":"[^"]*","Namespace":"[^"]*"' |
      sed 's/"ID":"\([^"]*\)".*"Namespace":"\([^"]*\)"/\2 \1/' | while read -r ns id; do
        "$NOMAD" job stop -namespace "$ns" -purge -detach "$id" >/dev/null 2>&1 || true
      done
    for _ in $(seq 15); do
      curl -s "$NOMAD_ADDR/v1/allocations?namespace=*" | grep -q '"ClientStatus":"running"' || break
      sleep 1
    done
  fi
  for name in nomad-client-1 nomad-client-2; do
    port=$([ "$name" = nomad-client-1 ] && echo 4656 || echo 4666)
    # Release the clients' allocations (and their mounts) before they stop.
    curl -sf -X PUT "http://127.0.0.1:$port/v1/client/gc" >/dev/null 2>&1 || true
  done
  for name in gpu-broker nomad-client-1 nomad-client-2 nomad-server consul; do
    pidfile="$DEMO_DIR/$name.pid"
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill -INT "$pid" 2>/dev/null || true
    for _ in $(seq 15); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$pidfile"
  done
  # Whatever task survived: each executor leads its own session, with its task.
  for pid in $(pgrep -f "nomad executor .*$DEMO_DIR/" || true); do pkill -KILL -s "$pid" || true; done
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
