variable "tenants" {
  description = "Tenants as the broker's policy files define them; `gpu-broker policy tenants -tfvars DIR` prints this variable from a policy directory."
  type = map(object({
    namespaces = list(string)
    submitters = optional(list(string), [])
  }))

  validation {
    condition     = length(flatten([for t in values(var.tenants) : t.namespaces])) == length(distinct(flatten([for t in values(var.tenants) : t.namespaces])))
    error_message = "A namespace belongs to one tenant only."
  }
}

variable "enforcement" {
  description = "The broker's enforcement mode: \"passthrough\" (users keep job-write rights in Nomad) or \"exclusive\" (only the broker writes jobs in tenant namespaces)."
  type        = string
  default     = "passthrough"

  validation {
    condition     = contains(["passthrough", "exclusive"], var.enforcement)
    error_message = "enforcement must be \"passthrough\" or \"exclusive\"."
  }
}

variable "scheduler_algorithm" {
  description = "binpack keeps whole nodes free for large GPU jobs; spread evens load out."
  type        = string
  default     = "binpack"
}

variable "policy_dir" {
  description = "Directory of the broker's policy files (*.hcl), shipped to the broker job."
  type        = string

  validation {
    condition     = length(fileset(var.policy_dir, "*.hcl")) > 0
    error_message = "policy_dir holds no *.hcl policy files."
  }
}

variable "kv_prefix" {
  description = "The broker's Consul KV prefix (broker.hcl consul.kv_prefix)."
  type        = string
  default     = "nomad-gpu/"

  validation {
    condition     = endswith(var.kv_prefix, "/")
    error_message = "kv_prefix must end with \"/\"."
  }
}

variable "broker" {
  description = "The gpu-broker Nomad job: instances (one leader through a Consul lock, all serve), where its binary is on the nodes (/usr/bin/gpu-broker, as the release's package installs it) or the release zip's url and sha256 (Nomad downloads and checks it), and its port."
  type = object({
    count         = optional(number, 2)
    namespace     = optional(string, "default")
    datacenters   = optional(list(string), ["*"])
    node_pool     = optional(string, "default")
    driver        = optional(string, "exec")
    binary        = optional(string, "/usr/bin/gpu-broker")
    url           = optional(string, "")
    sha256        = optional(string, "")
    port          = optional(number, 4649)
    nomad_address = optional(string, "http://127.0.0.1:4646")
    consul_addr   = optional(string, "127.0.0.1:8500")
  })
  default = {}

  validation {
    condition     = var.broker.url == "" || can(regex("^[0-9a-f]{64}$", var.broker.sha256))
    error_message = "broker.sha256 must be the 64 hex digits of the zip at broker.url (its line in the release's SHA256SUMS)."
  }
}

variable "broker_tls" {
  description = "The brokers' certificate and key (PEM): each serves HTTPS on its node's address, where a remote Prometheus scrapes /metrics (the Consul service's meta metrics_scheme says https). Null: HTTP. The certificate must name the nodes' addresses (or a name they share)."
  type = object({
    cert_pem = string
    key_pem  = string
  })
  default   = null
  sensitive = true
}
