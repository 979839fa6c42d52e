output "nomad_client_hcl" {
  description = "Nomad client configuration (<nomad_config_dir>/client.hcl)."
  value       = local.nomad_client_hcl
}

output "consul_client_hcl" {
  description = "Consul client configuration (<consul_config_dir>/client.hcl)."
  value       = local.consul_client_hcl
}

output "nomad_service" {
  description = "systemd unit for the Nomad client where HashiCorp's nomad package installed none (cloud-init installs it only then); nomad_dropin is added to either."
  value       = local.nomad_service
}

output "consul_service" {
  description = "systemd unit for the Consul client where HashiCorp's consul package installed none (cloud-init installs it only then); consul_dropin is added to either."
  value       = local.consul_service
}

output "nomad_dropin" {
  description = "systemd drop-in (/etc/systemd/system/nomad.service.d/nomad-gpu.conf) that runs the Nomad client on nomad_config_dir, keeping everything else the unit sets."
  value       = local.nomad_dropin
}

output "consul_dropin" {
  description = "systemd drop-in (/etc/systemd/system/consul.service.d/nomad-gpu.conf) that runs the Consul client on consul_config_dir, keeping everything else the unit sets."
  value       = local.consul_dropin
}

output "install_units" {
  description = "The commands that install the module's own units where no package installed one (a provisioner runs them after writing files, before systemctl daemon-reload)."
  value       = local.install_units
}

output "files" {
  description = "Every file above by path, with its mode, for a provisioner or an image build."
  value       = local.files
}

output "cloud_init" {
  description = "cloud-init user data that writes the files, installs the plugin when plugin_url is set, installs the module's own units where no package did, and starts Consul and Nomad."
  value       = local.cloud_init

  precondition {
    condition     = var.plugin_url == "" || var.plugin_sha256 != ""
    error_message = "plugin_url is set without plugin_sha256: the downloaded plugin could not be checked."
  }
}
