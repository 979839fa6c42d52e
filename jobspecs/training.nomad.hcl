# Distributed training: a batch job whose workers each take GPUs, checkpoint
# as they go and when told to stop, and resume from the last checkpoint when an
# allocation is lost or preempted. Submit through the broker:
#   NOMAD_ADDR=http://127.0.0.1:4649 nomad job run jobspecs/training.nomad.hcl
#
# The checkpoint lives in the host volume "checkpoints", not in the allocation:
# a preempted borrowed job goes back to the broker's queue and is registered
# again later, so its next allocation is a new one (no sticky ephemeral disk
# to inherit), possibly on another node. On a cluster the volume is a shared
# filesystem mounted at the same path on every GPU node (terraform/modules/
# gpu-node declares it).
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

variable "checkpoint_dir" {
  description = "Where the checkpoints volume is seen by the task: its host path for raw_exec (which mounts nothing), its volume_mount destination for docker or exec."
  type        = string
  default     = "/opt/nomad/checkpoints"
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

    # Placed only on nodes that have the volume.
    volume "checkpoints" {
      type   = "host"
      source = "checkpoints"
    }

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
      # use the docker driver with the NVIDIA runtime (NVIDIA_VISIBLE_DEVICES is
      # set) and add: volume_mount { volume = "checkpoints"  destination = "/checkpoints" }
      driver = "raw_exec"

      # On preemption Nomad sends kill_signal and waits kill_timeout before it
      # kills: the task writes its checkpoint in between. The broker raises
      # kill_timeout to the training workload's checkpoint_grace.
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      env {
        CHECKPOINT_DIR = var.checkpoint_dir
      }

      config {
        command = "/bin/sh"
        args = ["-c", <<-EOT
          dir="$CHECKPOINT_DIR/$NOMAD_NAMESPACE/$NOMAD_JOB_ID"
          mkdir -p "$dir"
          ckpt="$dir/worker-$NOMAD_ALLOC_INDEX"
          save() { echo "$step" > "$ckpt.tmp" && mv "$ckpt.tmp" "$ckpt"; }
          step=$(cat "$ckpt" 2>/dev/null || echo 0)
          echo "worker $NOMAD_ALLOC_INDEX on GPUs $NVIDIA_VISIBLE_DEVICES, resuming at step $step"
          trap 'save; echo "checkpoint at step $step, stopping"; exit 0' TERM INT
          while [ "$step" -lt 100000 ]; do
            step=$((step + 1))
            if [ $((step % 10)) -eq 0 ]; then save; fi
            sleep 1
          done
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
