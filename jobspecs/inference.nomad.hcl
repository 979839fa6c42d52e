# Online inference: a service that deploys with a canary, reverts on its own
# when the new version is unhealthy, and scales between bounds.
variable "namespace" {
  type    = string
  default = "search"
}

variable "replicas" {
  type    = number
  default = 3
}

job "ranker" {
  namespace   = var.namespace
  type        = "service"
  datacenters = ["*"]

  meta = {
    "nomad-gpu.queue" = "inference"
  }

  update {
    max_parallel      = 1
    canary            = 1
    min_healthy_time  = "10s"
    healthy_deadline  = "5m"
    progress_deadline = "10m"
    auto_revert       = true
    auto_promote      = true
    health_check      = "task_states"
  }

  group "serve" {
    count = var.replicas

    scaling {
      enabled = true
      min     = 1
      max     = 5
    }

    task "model" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "echo serving on GPUs $NVIDIA_VISIBLE_DEVICES; exec sleep 86400"]
      }

      resources {
        cpu    = 100
        memory = 64

        device "nvidia/gpu" {
          count = 2
        }
      }
    }
  }
}
