# Distributed training: a batch job whose workers each take GPUs, checkpoint
# as they go, and retry from the last checkpoint when an allocation is lost or
# preempted. Submit through the broker:
#   NOMAD_ADDR=http://127.0.0.1:4649 nomad job run jobspecs/training.nomad.hcl
variable "namespace" {
  type    = string
  default = "vision"
}

variable "workers" {
  type    = number
  default = 2
}

variable "gpus_per_worker" {
  type    = number
  default = 4
}

job "train-resnet" {
  namespace   = var.namespace
  type        = "batch"
  datacenters = ["*"]

  # Nomad v1.6 HCL2 takes dotted meta keys only in the map form.
  meta = {
    "nomad-gpu.queue" = "training"
  }

  group "workers" {
    count = var.workers

    # Preempted or failed workers come back and resume from the checkpoint.
    restart {
      attempts = 3
      interval = "30m"
      delay    = "15s"
      mode     = "fail"
    }

    reschedule {
      attempts       = 10
      interval       = "24h"
      delay          = "30s"
      delay_function = "exponential"
      max_delay      = "10m"
      unlimited      = false
    }

    task "train" {
      # raw_exec keeps the example runnable on the demo cluster; production jobs
      # use the docker driver with the NVIDIA runtime (NVIDIA_VISIBLE_DEVICES is set).
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args = ["-c", <<-EOT
          ckpt="$NOMAD_ALLOC_DIR/data/checkpoint"
          step=$(cat "$ckpt" 2>/dev/null || echo 0)
          echo "worker $NOMAD_ALLOC_INDEX on GPUs $NVIDIA_VISIBLE_DEVICES, resuming at step $step"
          while [ "$step" -lt 100000 ]; do step=$((step + 1)); echo "$step" > "$ckpt"; sleep 1; done
        EOT
        ]
      }

      resources {
        cpu    = 100
        memory = 64

        device "nvidia/gpu" {
          count = var.gpus_per_worker

          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "40 GiB"
          }
        }
      }
    }
  }
}
