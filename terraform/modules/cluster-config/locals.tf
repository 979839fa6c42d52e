# Provider-free, so the tests apply this file with variables.tf alone.
locals {
  # namespace => tenant
  tenant_of = merge({}, [for name, t in var.tenants : { for ns in t.namespaces : ns => name }]...)

  policies = { for f in fileset(var.policy_dir, "*.hcl") : f => file("${var.policy_dir}/${f}") }
}
