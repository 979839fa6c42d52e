# Copy to /etc/nomad.d/nomad-device-gpu.hcl on a GPU client (every option:
# docs/device-plugin.md). The package put the plugin in this plugin_dir.
plugin_dir = "/opt/nomad/plugins"

plugin "nomad-device-gpu" {
  config {
    enabled            = true
    fingerprint_period = "1m"
    # ignored_gpu_ids  = ["GPU-..."]
  }
}
