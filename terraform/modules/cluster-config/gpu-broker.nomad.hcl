# gpu-broker as a Nomad job: every instance serves the Nomad API proxy, one of
# them (the holder of a Consul lock) runs the queue and reclaim loops. Applied
# by this module with `hcl2 { vars }`; also runnable by hand:
#   nomad job run -var policies="$(jq -n ...)" gpu-broker.nomad.hcl
# Its tokens come from the Nomad variable nomad/jobs/gpu-broker (items
# nomad_token, consul_token), which this module writes.

variable "namespace" {
  type    = string
  default = "default"
}

variable "count" {
  type    = number
  default = 2
}

variable "datacenters" {
  description = "JSON list of datacenters."
  type        = string
  default     = "[\"*\"]"
}

variable "node_pool" {
  type    = string
  default = "default"
}

variable "driver" {
  description = "exec isolates the broker; raw_exec where the exec driver is not available."
  type        = string
  default     = "exec"
}

variable "binary" {
  description = "Path of the gpu-broker binary on the nodes (where the release's package installs it); unused with url."
  type        = string
  default     = "/usr/bin/gpu-broker"
}

variable "url" {
  description = "Where Nomad downloads the release's zip (gpu-broker_<version>_linux_<arch>.zip) into the task, checked against sha256; empty: the binary is on the nodes."
  type        = string
  default     = ""
}

variable "sha256" {
  description = "SHA-256 of the zip at url (its line in the release's SHA256SUMS); required with url."
  type        = string
  default     = ""
}

variable "port" {
  type    = number
  default = 4649
}

variable "nomad_address" {
  type    = string
  default = "http://127.0.0.1:4646"
}

variable "consul_addr" {
  type    = string
  default = "127.0.0.1:8500"
}

variable "kv_prefix" {
  type    = string
  default = "nomad-gpu/"
}

variable "enforcement" {
  type    = string
  default = "passthrough"
}

variable "policies" {
  description = "JSON object: policy file name => its text."
  type        = string
}

variable "tls" {
  description = "Serve HTTPS (and metrics a remote Prometheus scrapes over it) with the certificate and key in the Nomad variable nomad/jobs/gpu-broker (items tls_cert, tls_key, PEM)."
  type        = bool
  default     = false
}

job "gpu-broker" {
  namespace   = var.namespace
  type        = "service"
  datacenters = jsondecode(var.datacenters)
  node_pool   = var.node_pool
  # Above every queue's band: Nomad never preempts the broker for GPU work.
  priority = 90

  group "broker" {
    count = var.count

    # Users reach every instance at the same port; one per node.
    constraint {
      distinct_hosts = true
    }

    network {
      port "http" {
        static = var.port
      }
    }

    service {
      name     = "gpu-broker"
      port     = "http"
      provider = "consul"

      # For Prometheus' consul_sd_configs: __meta_consul_service_metadata_*
      # say where and how to scrape (docs/operations.md).
      meta {
        metrics_path   = "/metrics"
        metrics_scheme = var.tls ? "https" : "http"
      }

      # /v1/gpu/health needs no token, so the check works with Nomad ACLs
      # on; it fails while Nomad refuses the broker's own token. Consul
      # does not hold the broker's CA: it checks liveness, not identity.
      check {
        type            = "http"
        protocol        = var.tls ? "https" : "http"
        tls_skip_verify = var.tls
        path            = "/v1/gpu/health"
        interval        = "10s"
        timeout         = "2s"
      }
    }

    update {
      max_parallel = 1
      auto_revert  = true
    }

    task "gpu-broker" {
      driver = var.driver

      config {
        command = var.url == "" ? var.binary : "local/gpu-broker"
        args    = ["serve", "-config", "local/broker.hcl"]
      }

      # The release's zip, checked before it is unpacked: a download that
      # does not match sha256 fails the task instead of running.
      dynamic "artifact" {
        for_each = var.url == "" ? [] : [var.url]

        content {
          source      = artifact.value
          destination = "local/"
          options {
            checksum = "sha256:${var.sha256}"
          }
        }
      }

      # The broker's Nomad token: a new one (rotated, or one replacing a
      # revoked token) is read on SIGHUP, with no restart.
      template {
        destination   = "secrets/nomad-token"
        data          = "{{ with nomadVar \"nomad/jobs/gpu-broker\" }}{{ .nomad_token }}{{ end }}"
        change_mode   = "signal"
        change_signal = "SIGHUP"
      }

      # Its certificate and key: a renewed pair is read on SIGHUP.
      dynamic "template" {
        for_each = var.tls ? ["tls_cert", "tls_key"] : []

        content {
          destination   = "secrets/${template.value}.pem"
          data          = "{{ with nomadVar \"nomad/jobs/gpu-broker\" }}{{ .${template.value} }}{{ end }}"
          perms         = "0600"
          change_mode   = "signal"
          change_signal = "SIGHUP"
        }
      }

      template {
        destination = "local/broker.hcl"
        # A new Consul token restarts the broker; a policy change only reloads it.
        change_mode = "restart"
        data        = <<-EOT
          listen      = "{{ env "NOMAD_ADDR_http" }}"
          advertise   = "${var.tls ? "https" : "http"}://{{ env "NOMAD_ADDR_http" }}"
          policy_dir  = "{{ env "NOMAD_TASK_DIR" }}/policies"
          enforcement = "${var.enforcement}"
          nomad {
            address = "${var.nomad_address}"
            token_file = "{{ env "NOMAD_SECRETS_DIR" }}/nomad-token"
          }
          consul {
            address   = "${var.consul_addr}"
            token     = "{{ with nomadVar "nomad/jobs/gpu-broker" }}{{ .consul_token }}{{ end }}"
            kv_prefix = "${var.kv_prefix}"
          }
          ${var.tls ? "tls {\n  cert_file = \"{{ env \"NOMAD_SECRETS_DIR\" }}/tls_cert.pem\"\n  key_file  = \"{{ env \"NOMAD_SECRETS_DIR\" }}/tls_key.pem\"\n}" : ""}
        EOT
      }

      dynamic "template" {
        for_each = jsondecode(var.policies)

        content {
          destination   = "local/policies/${template.key}"
          data          = template.value
          change_mode   = "signal"
          change_signal = "SIGHUP"
          # Policy files are HCL, not templates: delimiters they never contain.
          left_delimiter  = "[[[nomad-gpu:"
          right_delimiter = ":nomad-gpu]]]"
        }
      }

      resources {
        cpu    = 500
        memory = 256
      }
    }
  }
}
