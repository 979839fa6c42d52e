locals {
  nomad_client_hcl = templatefile("${path.module}/templates/nomad-client.hcl.tftpl", {
    node_name            = var.node_name
    region               = var.region
    datacenter           = var.datacenter
    nomad_data_dir       = var.nomad_data_dir
    plugin_dir           = var.plugin_dir # "": not written, Nomad's own
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

  # Drop-ins that add what the clients need to the units HashiCorp's
  # packages install, which keep the rest (a unit of the same name in
  # /etc/systemd/system would replace theirs whole). Where no package
  # installed a unit, the module's own is installed first (units below).
  nomad_service  = templatefile("${path.module}/templates/nomad.service.tftpl", { nomad_binary = var.nomad_binary, config_dir = var.nomad_config_dir })
  consul_service = templatefile("${path.module}/templates/consul.service.tftpl", { consul_binary = var.consul_binary, config_dir = var.consul_config_dir })
  nomad_dropin   = templatefile("${path.module}/templates/nomad-dropin.conf.tftpl", { nomad_binary = var.nomad_binary, config_dir = var.nomad_config_dir })
  consul_dropin  = templatefile("${path.module}/templates/consul-dropin.conf.tftpl", { consul_binary = var.consul_binary, config_dir = var.consul_config_dir })

  # The module's own units wait outside systemd's search path, which
  # prefers /usr/local/lib/systemd/system to the packages' /usr/lib: there
  # they would replace the packages' units again.
  units_dir = "/usr/local/share/nomad-gpu/systemd"
  install_units = [for name in ["consul", "nomad"] :
    ["sh", "-c", "[ -e /usr/lib/systemd/system/${name}.service ] || [ -e /lib/systemd/system/${name}.service ] || [ -e /etc/systemd/system/${name}.service ] || install -m 0644 ${local.units_dir}/${name}.service /etc/systemd/system/${name}.service"]
  ]

  consul_client_path = "${var.consul_config_dir}/client.hcl"
  files = {
    "${var.nomad_config_dir}/client.hcl"                  = { content = local.nomad_client_hcl, permissions = "0640" }
    (local.consul_client_path)                            = { content = local.consul_client_hcl, permissions = "0640" }
    "/etc/systemd/system/nomad.service.d/nomad-gpu.conf"  = { content = local.nomad_dropin, permissions = "0644" }
    "/etc/systemd/system/consul.service.d/nomad-gpu.conf" = { content = local.consul_dropin, permissions = "0644" }
    "${local.units_dir}/nomad.service"                    = { content = local.nomad_service, permissions = "0644" }
    "${local.units_dir}/consul.service"                   = { content = local.consul_service, permissions = "0644" }
  }

  plugin_dir  = var.plugin_dir != "" ? var.plugin_dir : "${var.nomad_data_dir}/plugins"
  plugin_path = "${local.plugin_dir}/nomad-device-gpu"
  plugin_url  = replace(var.plugin_url, "{version}", var.plugin_version)

  # The download is checked against its SHA-256 before anything is
  # installed, in one shell with set -e: cloud-init runs runcmd on after a
  # failed command, so a wrong hash must stop the install itself, and Nomad
  # then starts without the plugin (no GPUs) rather than with another binary.
  # A .zip (a release of make release) holds the binary at its top.
  plugin_zip      = endswith(var.plugin_url, ".zip")
  plugin_download = "${local.plugin_path}.download"
  install_plugin = var.plugin_url == "" ? [] : [
    ["sh", "-c", join("; ", [
      "set -e",
      "curl -fsSL -o '${local.plugin_download}' '${local.plugin_url}'",
      "echo '${var.plugin_sha256}  ${local.plugin_download}' | sha256sum -c - || { rm -f '${local.plugin_download}'; exit 1; }",
      local.plugin_zip
      ? "unzip -p '${local.plugin_download}' nomad-device-gpu > '${local.plugin_path}.new'"
      : "mv '${local.plugin_download}' '${local.plugin_path}.new'",
      "chmod 0755 '${local.plugin_path}.new'",
      "mv '${local.plugin_path}.new' '${local.plugin_path}'",
      "rm -f '${local.plugin_download}'",
    ])],
  ]

  cloud_init = "#cloud-config\n${yamlencode(merge(local.plugin_zip ? { packages = ["unzip"] } : {}, {
    write_files = [for path, f in local.files : {
      path        = path
      content     = f.content
      permissions = f.permissions
      owner       = "root:root"
    }]
    runcmd = concat(
      [
        ["sh", "-c", "id consul >/dev/null 2>&1 || useradd --system --home ${var.consul_data_dir} --shell /bin/false consul"],
        ["mkdir", "-p", var.nomad_data_dir, local.plugin_dir, var.consul_data_dir],
        ["chown", "-R", "consul:consul", var.consul_data_dir],
        ["chgrp", "consul", local.consul_client_path],
      ],
      [for v in values(var.host_volumes) : ["mkdir", "-p", v.path]],
      local.install_plugin,
      local.install_units,
      [
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "--now", "consul.service", "nomad.service"],
      ],
    )
  }))}"
}
