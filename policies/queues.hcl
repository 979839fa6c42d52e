# Queues map kinds of work to Nomad priority bands. Bands are at least 10 apart:
# Nomad preempts only across a gap of 10.
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

# Idle GPUs beyond a tenant's guarantee are lent at this band, so Nomad evicts
# borrowed work as soon as an owner needs its GPUs back.
borrowing {
  enabled  = true
  priority = 20
}

# Written to Nomad's scheduler configuration when the broker starts.
preemption {
  batch   = true
  service = true
}
