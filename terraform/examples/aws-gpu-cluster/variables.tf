variable "region" {
  type    = string
  default = "us-east-1"
}

variable "cluster_name" {
  type    = string
  default = "gpu"
}

variable "vpc_id" {
  type = string
}

variable "subnet_ids" {
  description = "Private subnets for servers and GPU clients."
  type        = list(string)
}

variable "user_cidrs" {
  description = "Networks from which users reach the broker."
  type        = list(string)
  default     = []
}

variable "server_ami" {
  description = "An image with nomad and consul installed (and systemd units for both)."
  type        = string
}

variable "server_instance_type" {
  type    = string
  default = "m6i.large"
}

variable "gpu_ami" {
  description = "An image with the NVIDIA driver, nomad and consul installed."
  type        = string
}

variable "gpu_instance_type" {
  type    = string
  default = "p5.48xlarge"
}

variable "gpu_nodes_min" {
  type    = number
  default = 2
}

variable "gpu_nodes_max" {
  type    = number
  default = 8
}

variable "shared_gpus_per_node" {
  description = "GPUs per node offered as time-sliced replicas for dev work (0: none)."
  type        = number
  default     = 1
}

variable "plugin_url" {
  description = "Download address of a release zip of nomad-device-gpu (make release); {version} is replaced."
  type        = string
}

variable "plugin_sha256" {
  description = "The zip's SHA-256, from the release's SHA256SUMS."
  type        = string
}

variable "plugin_version" {
  type    = string
  default = "0.1.0"
}

variable "tenants_file" {
  description = "Output of `gpu-broker policy tenants -tfvars POLICY_DIR`."
  type        = string
  default     = "tenants.json"
}

variable "policy_dir" {
  type    = string
  default = "../../../policies"
}

variable "nomad_bootstrap_token" {
  type      = string
  sensitive = true
}

variable "consul_bootstrap_token" {
  type      = string
  sensitive = true
}
