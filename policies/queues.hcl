# Queues order kinds of work. Guaranteed work runs at Nomad priorities within 9
# of each other, in this order (inference 49, training 45, dev 40): Nomad preempts
# only across a gap of 10, so no tenant's guaranteed job evicts another's; only
# borrowed work, 10 or more below, is evicted. preempts_within_guarantee = true
# on a queue runs its jobs at its own priority instead.
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
  # A job evicted while borrowed borrows again only after 30m, doubling with
  # each eviction up to 24h (within its guarantee it runs at any time).
  backoff     = "30m"
  max_backoff = "24h"
  # A running borrowed job whose tenant's guarantee has room again may be
  # promoted in place to its queue's band: promote_below = 0.5 does so while
  # the tenant's guaranteed work stays within half its guarantee (off by
  # default; the trade-off is in docs/simulator.md).
  # Running borrowed work moves in place through sub-bands 20-29 as the GPU
  # time a preemption would lose grows (from 15 GPU-minutes, doubling each
  # step), so that Nomad evicts the newest and smallest first: sub_bands and
  # sub_band_step, on by default.
}

# Written to Nomad's scheduler configuration when the broker starts.
preemption {
  batch   = true
  service = true
}
