# Interactive development environment: one GPU, or with -var replica=true one
# time-sliced replica of a shared GPU, in the low "dev" band, meant to be
# short-lived. The TTL is recorded for the broker's reclaim rules. A replica
# counts against the tenant's quota as 1/N of a GPU (N replicas per GPU); it
# shares the GPU's memory and faults with the other replicas' tasks.
variable "namespace" {
  type    = string
  default = "vision"
}

variable "user" {
  type    = string
  default = "ana"
}

variable "replica" {
  description = "Ask for a replica of a shared GPU (the plugin's sharing block) instead of a whole GPU."
  type        = bool
  default     = false
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

          # Only replicas carry shared = true; the broker reads this
          # constraint as Nomad does and charges the share.
          dynamic "constraint" {
            for_each = var.replica ? [true] : []
            content {
              attribute = "$${device.attr.shared}"
              value     = "true"
            }
          }
        }
      }
    }
  }
}
