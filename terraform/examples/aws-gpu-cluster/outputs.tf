output "broker_address" {
  description = "Users' NOMAD_ADDR: every broker instance serves, and Consul DNS names them all."
  value       = "http://gpu-broker.service.consul:4649"
}

output "user_roles" {
  value = module.cluster_config.user_roles
}
