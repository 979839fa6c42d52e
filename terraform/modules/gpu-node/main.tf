locals {
  nomad_client_hcl = templatefile("${path.module}/templates/nomad-client.hcl.tftpl", {
    node_name            = var.node_name
    region               = var.region
    datacenter           = var.datacenter
    nomad_data_dir       = var.nomad_data_dir
    plugin_dir           = var.plugin_dir
    bind_addr            = var.bind_addr
    advertise_addr       = var.advertise_addr != "" ? var.advertise_addr : var.bind_addr
    ports                = var.nomad_ports
    nomad_servers        = var.nomad_servers
    node_pool            = var.node_pool
    node_class           = var.node_class
    fingerprint_denylist = var.fingerprint_denylist
    host_volumes         = var.host_volumes
    consul_address       = var.consul_address
    plugin               = var.plugin_config
    sharing              = var.gpu_sharing
    extra                = trimspace(var.extra_nomad_hcl)
  })

  consul_client_hcl = templatefile("${path.module}/templates/consul-client.hcl.tftpl", {
    node_name  = var.node_name
    datacenter = var.datacenter
    data_dir   = var.consul_data_dir
    bind_addr  = var.bind_addr
    retry_join = var.consul_retry_join
  })

  nomad_service  = templatefile("${path.module}/templates/nomad.service.tftpl", { nomad_binary = var.nomad_binary })
  consul_service = templatefile("${path.module}/templates/consul.service.tftpl", { consul_binary = var.consul_binary })

  files = {
    "/etc/nomad.d/client.hcl"            = { content = local.nomad_client_hcl, permissions = "0640" }
    "/etc/consul.d/client.hcl"           = { content = local.consul_client_hcl, permissions = "0640" }
    "/etc/systemd/system/nomad.service"  = { content = local.nomad_service, permissions = "0644" }
    "/etc/systemd/system/consul.service" = { content = local.consul_service, permissions = "0644" }
  }

  plugin_path = "${var.plugin_dir}/nomad-device-gpu"
  plugin_url  = replace(var.plugin_url, "{version}", var.plugin_version)

  # The plugin is checked against its SHA-256 before Nomad starts, so a node
  # never loads a binary other than the one this configuration names.
  install_plugin = var.plugin_url == "" ? [] : [
    ["curl", "-fsSL", "-o", "${local.plugin_path}.download", local.plugin_url],
    ["sh", "-c", "echo '${var.plugin_sha256}  ${local.plugin_path}.download' | sha256sum -c -"],
    ["install", "-m", "0755", "${local.plugin_path}.download", local.plugin_path],
    ["rm", "-f", "${local.plugin_path}.download"],
  ]

  cloud_init = "#cloud-config\n${yamlencode({
    write_files = [for path, f in local.files : {
      path        = path
      content     = f.content
      permissions = f.permissions
      owner       = "root:root"
    }]
    runcmd = concat(
      [
        ["sh", "-c", "id consul >/dev/null 2>&1 || useradd --system --home ${var.consul_data_dir} --shell /bin/false consul"],
        ["mkdir", "-p", var.nomad_data_dir, var.plugin_dir, var.consul_data_dir],
        ["chown", "-R", "consul:consul", var.consul_data_dir],
        ["chgrp", "consul", "/etc/consul.d/client.hcl"],
      ],
      [for v in values(var.host_volumes) : ["mkdir", "-p", v.path]],
      local.install_plugin,
      [
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "--now", "consul.service", "nomad.service"],
      ],
    )
  })}"
}
