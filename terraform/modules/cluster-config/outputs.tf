output "namespaces" {
  description = "Tenant namespaces, namespace => tenant."
  value       = local.tenant_of
}

output "user_roles" {
  description = "Nomad ACL role per tenant, to give to its users (and to name in `submitters` for exclusive enforcement)."
  value       = { for t, r in nomad_acl_role.users : t => r.name }
}

output "broker_token_accessor" {
  description = "Accessor of the broker's Nomad management token (its secret is in the Nomad variable nomad/jobs/gpu-broker)."
  value       = nomad_acl_token.broker.accessor_id
}
