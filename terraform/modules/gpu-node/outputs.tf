output "nomad_client_hcl" {
  description = "Nomad client configuration (<nomad_config_dir>/client.hcl)."
  value       = local.nomad_client_hcl
}

output "consul_client_hcl" {
  description = "Consul client configuration (<consul_config_dir>/client.hcl)."
  value       = local.consul_client_hcl
}

output "nomad_service" {
  description = "systemd unit for the Nomad client."
  value       = local.nomad_service
}

output "consul_service" {
  description = "systemd unit for the Consul client."
  value       = local.consul_service
}

output "files" {
  description = "Every file above by path, with its mode, for a provisioner or an image build."
  value       = local.files
}

output "cloud_init" {
  description = "cloud-init user data that writes the files, installs the plugin when plugin_url is set, and starts Consul and Nomad."
  value       = local.cloud_init

  precondition {
    condition     = var.plugin_url == "" || var.plugin_sha256 != ""
    error_message = "plugin_url is set without plugin_sha256: the downloaded plugin could not be checked."
  }
}
