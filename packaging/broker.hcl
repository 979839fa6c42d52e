# gpu-broker's configuration (every key: docs/broker.md). Put a policy in
# /etc/gpu-broker/policies (examples: /usr/share/doc/gpu-broker/examples),
# then: systemctl enable --now gpu-broker
listen     = "127.0.0.1:4649"
policy_dir = "/etc/gpu-broker/policies"

nomad {
  address = "http://127.0.0.1:4646"
  # token_file = "/etc/gpu-broker/nomad-token"   # a management token when ACLs are on
}

consul {
  address   = "127.0.0.1:8500"
  kv_prefix = "nomad-gpu/"
}

audit {
  path = "/var/log/gpu-broker/audit.log"
}
