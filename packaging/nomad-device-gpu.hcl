# Copy to /etc/nomad.d/nomad-device-gpu.hcl on a GPU client (every option:
# docs/device-plugin.md). The package put the plugin in
# /opt/nomad/data/plugins, Nomad's own plugin_dir for data_dir =
# "/opt/nomad/data" (HashiCorp's package's): no plugin_dir is needed, and
# setting one would hide the plugins there. With another data_dir, set
# plugin_dir to a directory holding the plugin and every other one you use.

plugin "nomad-device-gpu" {
  config {
    enabled            = true
    fingerprint_period = "1m"
    # ignored_gpu_ids  = ["GPU-..."]
  }
}
