gpu_class "h100" {
  models             = ["NVIDIA H100*"]
  price_per_gpu_hour = 2.50 # in the policy's currency (usage.hcl); for usage reports
}

tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training", "dev"] # the first is the default queue
  guaranteed = 8
  limit      = 12
}

tenant "search" {
  namespaces = ["search"]
  queues     = ["inference", "training"]
  guaranteed = 6
  limit      = 10
}

tenant "research" {
  namespaces = ["research"]
  queues     = ["dev", "training"]
  guaranteed = { h100 = 2 }
  limit      = { h100 = 8 }
  # Past 2000 GPU-hours in a month, its jobs run borrowed (preemptible)
  # until the month ends.
  budget {
    gpu_hours = 2000
    period    = "month"
  }
}
