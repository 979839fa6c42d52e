# make sim-check's policy: three tenants share 32 GPUs (4 nodes of 8), each
# guaranteed about a third and allowed to borrow the rest; the times are
# scaled to a run of minutes.
queue "training" { priority = 60 }
queue "dev" { priority = 40 }

tenant "a" {
  namespaces = ["a"]
  queues     = ["training", "dev"]
  guaranteed = 12
  limit      = 32
}

tenant "b" {
  namespaces = ["b"]
  queues     = ["training", "dev"]
  guaranteed = 10
  limit      = 32
}

tenant "c" {
  namespaces = ["c"]
  queues     = ["training", "dev"]
  guaranteed = 10
  limit      = 32
}

borrowing {
  enabled     = true
  priority    = 20
  backoff     = "20s"
  max_backoff = "2m"
  # Sub-bands (on by default) from 4 GPU-seconds at stake: jobs of 10-40 s
  # on 1-8 GPUs spread over all of them, as hours-long jobs over 15 GPU-minutes.
  sub_band_step = "4s"
}

preemption {
  batch   = true
  service = true
}

reclaim_settings {
  period = "1s"
}

# The simulator does not model make-room.
make_room = "wait"
