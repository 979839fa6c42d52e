# Ten tenants share 10,000 GPUs: each is guaranteed a tenth and may borrow
# up to the whole cluster while GPUs are idle. The scale and goal benchmarks
# of the simulator (broker/sim) run with it.

queue "inference" {
  priority = 80
  workload = "inference"
}

queue "training" {
  priority = 60
  workload = "training"
}

queue "dev" {
  priority = 40
  workload = "dev"
}

# Inference services keep no checkpoint: evicted, they lose everything they
# did. Borrowed, they run on within their tenant's guarantee as soon as it
# holds them (docs/simulator.md, "Work that keeps no checkpoint").
workload "inference" {
  promote_below = 0.75
}
workload "training" {}
workload "dev" {
  max_gpus = 1
}

borrowing {
  enabled  = true
  priority = 20
}

preemption {
  batch   = true
  service = true
}

fair_share {
  half_life = "24h"
}

reclaim "idle-dev" {
  workload   = "dev"
  idle_below = 5
  idle_for   = "30m"
  action     = "stop"
  grace      = "5m"
  mode       = "enforce"
}

reclaim "dev-ttl" {
  workload     = "dev"
  max_lifetime = "8h"
  action       = "stop"
  grace        = "5m"
  mode         = "enforce"
}

tenant "team0" {
  namespaces = ["team0"]
  queues     = ["training", "dev", "inference"]
  guaranteed = 1000
  limit      = 10000
  max_queued = 100000
}

tenant "team1" {
  namespaces = ["team1"]
  queues     = ["training", "dev", "inference"]
  guaranteed = 1000
  limit      = 10000
  max_queued = 100000
}

tenant "team2" {
  namespaces = ["team2"]
  queues     = ["training", "dev", "inference"]
  guaranteed = 1000
  limit      = 10000
  max_queued = 100000
}

tenant "team3" {
  namespaces = ["team3"]
  queues     = ["training", "dev"]
  guaranteed = 1000
  limit      = 10000
  max_queued = 100000
}

tenant "team4" {
  namespaces = ["team4"]
  queues     = ["training", "dev"]
  guaranteed = 1000
  limit      = 10000
  max_queued = 100000
}

tenant "team5" {
  namespaces = ["team5"]
  queues     = ["training", "dev"]
  guaranteed = 1000
  limit      = 10000
  max_queued = 100000
}

tenant "team6" {
  namespaces = ["team6"]
  queues     = ["training", "dev"]
  guaranteed = 1000
  limit      = 10000
  max_queued = 100000
}

tenant "team7" {
  namespaces = ["team7"]
  queues     = ["training", "dev"]
  guaranteed = 1000
  limit      = 10000
  max_queued = 100000
}

tenant "team8" {
  namespaces = ["team8"]
  queues     = ["training", "dev"]
  guaranteed = 1000
  limit      = 10000
  max_queued = 100000
}

tenant "team9" {
  namespaces = ["team9"]
  queues     = ["training", "dev"]
  guaranteed = 1000
  limit      = 10000
  max_queued = 100000
}
