# Reclaim: GPUs that running jobs hold without using them well. A rule is
# dry-run unless it says mode = "enforce": its decisions are recorded in
# Consul KV (gpu-broker reclaim list) and nothing is done.

reclaim_settings {
  period    = "30s"
  retention = "720h"
}

# Development environments idle for half an hour are stopped, 5 minutes after
# the decision (cancel it with `gpu-broker reclaim cancel ID`).
reclaim "idle-dev" {
  workload   = "dev"
  idle_below = 5
  idle_for   = "30m"
  action     = "stop"
  grace      = "5m"
  mode       = "enforce"
}

# ... and live 8 hours; a job may ask for up to 4 more (meta nomad-gpu.ttl).
reclaim "dev-ttl" {
  workload     = "dev"
  max_lifetime = "8h"
  max_extend   = "4h"
  action       = "stop"
  grace        = "5m"
  mode         = "enforce"
}

# Work on a GPU unhealthy for 2 minutes is placed again, on healthy ones.
reclaim "sick-gpu" {
  device_unhealthy_for = "2m"
  action               = "reschedule"
  mode                 = "enforce"
}

reclaim "crash-loop" {
  restarts_above = 5
  within         = "30m"
  action         = "stop"
  mode           = "enforce"
}

# GPU jobs written straight to Nomad. Enforce once every team submits through
# the broker (or with enforcement = "exclusive", where none can do otherwise).
reclaim "unadmitted" {
  unadmitted = true
  action     = "stop"
  mode       = "dry-run"
}
