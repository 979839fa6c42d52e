# Every variable has a default that renders a working single-machine client
# (loopback, the fake GPU backend off, NVML auto-detected), so `tofu apply`
# with no inputs shows a complete example.

variable "node_name" {
  description = "Nomad client name; empty lets Nomad use the host name."
  type        = string
  default     = ""
}

variable "region" {
  description = "Nomad region."
  type        = string
  default     = "global"
}

variable "datacenter" {
  description = "Nomad and Consul datacenter."
  type        = string
  default     = "dc1"
}

variable "node_pool" {
  description = "Nomad node pool of the GPU clients (Nomad creates it on first use)."
  type        = string
  default     = "gpu"
}

variable "node_class" {
  description = "Nomad node class, for constraints and for `nomad node status -filter`."
  type        = string
  default     = "gpu"
}

variable "bind_addr" {
  description = "Address Nomad and Consul bind to. A go-sockaddr template such as {{ GetPrivateIP }} is passed through."
  type        = string
  default     = "127.0.0.1"
}

variable "advertise_addr" {
  description = "Address the other agents reach this one at; empty: bind_addr (Nomad refuses to guess it for a loopback bind)."
  type        = string
  default     = ""
}

variable "nomad_servers" {
  description = "Nomad server RPC addresses (host:port) the client joins."
  type        = list(string)
  default     = ["127.0.0.1:4647"]

  validation {
    condition     = length(var.nomad_servers) > 0
    error_message = "nomad_servers must name at least one server."
  }
}

variable "nomad_ports" {
  description = "Nomad client ports."
  type = object({
    http = optional(number, 4646)
    rpc  = optional(number, 4647)
    serf = optional(number, 4648)
  })
  default = {}
}

variable "consul_address" {
  description = "The Consul agent the Nomad client talks to (host:port)."
  type        = string
  default     = "127.0.0.1:8500"
}

variable "consul_retry_join" {
  description = "Consul server addresses (or cloud auto-join strings) the Consul client joins."
  type        = list(string)
  default     = ["127.0.0.1"]
}

variable "nomad_data_dir" {
  type    = string
  default = "/opt/nomad/data"
}

variable "consul_data_dir" {
  type    = string
  default = "/opt/consul/data"
}

variable "plugin_dir" {
  description = "Nomad plugin_dir, where cloud-init installs nomad-device-gpu. Empty: Nomad's own, <nomad_data_dir>/plugins (where the .deb and .rpm put it for HashiCorp's data_dir, /opt/nomad/data), so that other plugins there stay loaded."
  type        = string
  default     = ""
}

variable "nomad_config_dir" {
  description = "The directory of the Nomad client's configuration, the only one its unit loads: HashiCorp's nomad package's own /etc/nomad.d/nomad.hcl (a one-node server and a client of 127.0.0.1) stays unread beside it."
  type        = string
  default     = "/etc/nomad-gpu/nomad.d"

  validation {
    condition     = startswith(var.nomad_config_dir, "/") && var.nomad_config_dir != "/etc/nomad.d"
    error_message = "nomad_config_dir must be an absolute path other than /etc/nomad.d, where HashiCorp's nomad package puts a server configuration."
  }
}

variable "consul_config_dir" {
  description = "The directory of the Consul client's configuration, the only one its unit loads (HashiCorp's consul package's /etc/consul.d/consul.hcl stays unread)."
  type        = string
  default     = "/etc/nomad-gpu/consul.d"

  validation {
    condition     = startswith(var.consul_config_dir, "/") && var.consul_config_dir != "/etc/consul.d"
    error_message = "consul_config_dir must be an absolute path other than /etc/consul.d, where HashiCorp's consul package puts its own configuration."
  }
}

variable "plugin_version" {
  description = "nomad-device-gpu version that cloud-init installs from plugin_url."
  type        = string
  default     = "0.1.0"
}

variable "plugin_url" {
  description = "Where cloud-init downloads nomad-device-gpu: a release zip of make release (nomad-device-gpu_{version}_linux_amd64.zip; cloud-init installs unzip) or the binary itself; https:// or file://. \"{version}\" is replaced by plugin_version. Empty: the binary is already in plugin_dir (baked into the image)."
  type        = string
  default     = ""

  validation {
    condition     = var.plugin_url == "" || can(regex("^(https?|file)://[^'\\s]+$", var.plugin_url))
    error_message = "plugin_url must be an https://, http:// or file:// URL without quotes or spaces."
  }
}

variable "plugin_sha256" {
  description = "SHA-256 of what plugin_url downloads (for a zip, its line in the release's SHA256SUMS); required with plugin_url."
  type        = string
  default     = ""

  validation {
    condition     = var.plugin_sha256 == "" || can(regex("^[0-9a-f]{64}$", var.plugin_sha256))
    error_message = "plugin_sha256 must be 64 lower-case hex digits."
  }
}

variable "plugin_config" {
  description = "The nomad-device-gpu options (see the README's table); fake is for machines without GPUs."
  type = object({
    backend            = optional(string, "auto")
    fingerprint_period = optional(string, "1m")
    stats_period       = optional(string, "")
    health_recovery    = optional(string, "5m")
    ignored_gpu_ids    = optional(list(string), [])
    fake = optional(object({
      count     = optional(number, 8)
      model     = optional(string, "NVIDIA H100 80GB HBM3")
      id_prefix = optional(string, "")
    }))
  })
  default = {}

  validation {
    condition     = contains(["auto", "nvml", "fake"], var.plugin_config.backend)
    error_message = "plugin_config.backend must be one of \"auto\", \"nvml\", \"fake\"."
  }
}

variable "gpu_sharing" {
  description = "Time-sliced GPUs for dev work: each of the first `gpus` GPUs (0: all) is offered as `replicas` devices. Null: every GPU whole."
  type = object({
    replicas = number
    gpus     = optional(number, 0)
  })
  default = null

  validation {
    condition     = var.gpu_sharing == null ? true : (var.gpu_sharing.replicas >= 2 && var.gpu_sharing.replicas <= 64 && var.gpu_sharing.gpus >= 0)
    error_message = "gpu_sharing.replicas must be 2-64 and gpu_sharing.gpus 0 or more."
  }
}

variable "host_volumes" {
  description = "Nomad host volumes. Training jobs keep checkpoints in `checkpoints`; on a cluster it should be a shared filesystem (NFS, Lustre) mounted at the same path on every GPU node, so a preempted job resumes on any node."
  type = map(object({
    path      = string
    read_only = optional(bool, false)
  }))
  default = {
    checkpoints = { path = "/opt/nomad/checkpoints" }
  }
}

variable "fingerprint_denylist" {
  description = "Nomad fingerprinters not run. The cloud ones reach metadata addresses; remove one only where that address answers."
  type        = list(string)
  default     = ["env_aws", "env_gce", "env_azure", "env_digitalocean"]
}

variable "nomad_binary" {
  description = "The nomad the unit runs; HashiCorp's package installs /usr/bin/nomad."
  type        = string
  default     = "/usr/bin/nomad"
}

variable "consul_binary" {
  description = "The consul the unit runs; HashiCorp's package installs /usr/bin/consul."
  type        = string
  default     = "/usr/bin/consul"
}

variable "extra_nomad_hcl" {
  description = "Appended to the Nomad client configuration as is (TLS, ACL, telemetry)."
  type        = string
  default     = ""
}
