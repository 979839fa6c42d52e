# Batch inference: a parameterized job. Registering it places nothing; each
# `nomad job dispatch` creates a child job that the broker admits on its own
# (its GPU counted against the tenant then), which runs the model over one
# input and ends. A child runs at its parent's priority, so a dispatch is
# admitted only within the tenant's guarantee: one that would have to borrow
# is refused (dispatch again later, or register the parent again).
#   NOMAD_ADDR=http://127.0.0.1:4649 nomad job run jobspecs/batch-inference.nomad.hcl
#   NOMAD_ADDR=http://127.0.0.1:4649 nomad job dispatch -namespace research -meta input=s3://bucket/part-0001 batch-infer
variable "namespace" {
  type    = string
  default = "research"
}

job "batch-infer" {
  namespace   = var.namespace
  type        = "batch"
  datacenters = ["*"]

  # Batch work, not the protected inference band: it may borrow idle GPUs
  # and yield them when the owners need them.
  meta = {
    "nomad-gpu.queue" = "training"
  }

  parameterized {
    meta_required = ["input"]
  }

  group "infer" {
    # One attempt: a failed part is dispatched again by whoever drives the batch.
    restart {
      attempts = 0
      mode     = "fail"
    }

    reschedule {
      attempts  = 0
      unlimited = false
    }

    task "infer" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args = ["-c", <<-EOT
          echo "scoring $NOMAD_META_input on GPU $NVIDIA_VISIBLE_DEVICES"
          sleep 5
          echo done
        EOT
        ]
      }

      resources {
        cpu    = 100
        memory = 64

        # The model named: research's quota is per GPU class (h100).
        device "nvidia/gpu/NVIDIA H100 80GB HBM3" {
          count = 1
        }
      }
    }
  }
}
