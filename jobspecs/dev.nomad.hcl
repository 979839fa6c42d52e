# Interactive development environment: one GPU, in the low "dev" band, meant
# to be short-lived. The TTL is recorded for the broker's reclaim rules.
variable "namespace" {
  type    = string
  default = "vision"
}

variable "user" {
  type    = string
  default = "ana"
}

job "dev-env" {
  namespace   = var.namespace
  type        = "batch"
  datacenters = ["*"]

  meta = {
    "nomad-gpu.queue" = "dev"
    "nomad-gpu.ttl"   = "8h"
    "owner"           = var.user
  }

  group "env" {
    reschedule {
      attempts  = 0
      unlimited = false
    }

    task "shell" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "echo dev environment of $NOMAD_META_owner on $NVIDIA_VISIBLE_DEVICES; exec sleep 28800"]
      }

      resources {
        cpu    = 100
        memory = 64

        device "nvidia/gpu" {
          count = 1
        }
      }
    }
  }
}
