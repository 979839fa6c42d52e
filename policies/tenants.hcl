gpu_class "h100" {
  models = ["NVIDIA H100*"]
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
}
