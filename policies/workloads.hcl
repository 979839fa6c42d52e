# Workload classes: how the broker treats each kind of GPU work. A queue's
# workload (default: the queue's name) names one of these.

# Training wants all of its GPUs at once: a job of several allocations is
# admitted only when every one fits the free GPUs node by node (otherwise
# some workers would hold GPUs while the others wait). A preempted task gets
# two minutes to write its checkpoint, and a failed one is retried 3 times.
workload "training" {
  gang             = true
  checkpoint_grace = "2m"
  restart_attempts = 3
}

# Inference wants stability: it is registered only with canaries and
# auto_revert, and never in the borrowing band, so that its replicas are not
# preempted by an owner's work (an evicted replica is an outage, and a
# service keeps no checkpoint). Where replicas may be evicted, let it borrow
# with promote_below = 1 instead: borrowed, it then runs on within its
# tenant's guarantee as soon as that holds it (docs/simulator.md, "Work that
# keeps no checkpoint": never borrowing cost 17 points of busy share there).
workload "inference" {
  require_update    = true
  protect_min_count = true
}

# Dev environments: one GPU, eight hours unless the job asks for less (the
# reclaim rule dev-ttl stops them; nomad-gpu.ttl may ask for up to 12h).
workload "dev" {
  max_gpus    = 1
  default_ttl = "8h"
  shared      = true
}
