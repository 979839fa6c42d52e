resource "nomad_namespace" "tenant" {
  for_each = local.tenant_of

  name        = each.key
  description = "GPU tenant ${each.value}, admitted by gpu-broker"
  meta = {
    "nomad-gpu.tenant" = each.value
  }
}

# Preemption on for every scheduler: the broker runs borrowed GPU jobs at a
# lower priority, and Nomad's preemption is what evicts them when an owner
# comes back.
resource "nomad_scheduler_config" "gpu" {
  scheduler_algorithm             = var.scheduler_algorithm
  memory_oversubscription_enabled = false
  preemption_config = {
    batch_scheduler_enabled    = true
    service_scheduler_enabled  = true
    system_scheduler_enabled   = true
    sysbatch_scheduler_enabled = true
  }
}

resource "nomad_acl_policy" "users" {
  for_each = var.tenants

  name        = "${each.key}-users"
  description = "Users of GPU tenant ${each.key} (${var.enforcement})"
  rules_hcl = templatefile("${path.module}/templates/users-${var.enforcement}.hcl.tftpl", {
    tenant     = each.key
    namespaces = each.value.namespaces
  })
}

# A role per tenant: give it to the tenant's users, and name it in the
# tenant's `submitters` ("role:<tenant>-users") for exclusive enforcement.
resource "nomad_acl_role" "users" {
  for_each = var.tenants

  name        = "${each.key}-users"
  description = "Users of GPU tenant ${each.key}"

  policy {
    name = nomad_acl_policy.users[each.key].name
  }
}

# The broker reads every namespace, writes the scheduler configuration, and
# looks up queued jobs' submitters by token accessor, which Nomad shows to
# management tokens only.
resource "nomad_acl_token" "broker" {
  name = "gpu-broker"
  type = "management"
}

resource "consul_acl_policy" "broker" {
  name        = "gpu-broker"
  description = "gpu-broker: KV under ${var.kv_prefix} and the leader lock's sessions"
  rules       = templatefile("${path.module}/templates/consul-broker.hcl.tftpl", { kv_prefix = var.kv_prefix })
}

resource "consul_acl_token" "broker" {
  description = "gpu-broker"
  policies    = [consul_acl_policy.broker.name]
}

data "consul_acl_token_secret_id" "broker" {
  accessor_id = consul_acl_token.broker.id
}

# The job's tasks read their tokens from here (workload identity), so the
# tokens never appear in the job specification.
resource "nomad_variable" "broker" {
  path      = "nomad/jobs/gpu-broker"
  namespace = var.broker.namespace
  items = merge({
    nomad_token  = nomad_acl_token.broker.secret_id
    consul_token = data.consul_acl_token_secret_id.broker.secret_id
  }, var.broker_tls == null ? {} : { tls_cert = var.broker_tls.cert_pem, tls_key = var.broker_tls.key_pem })
}

resource "nomad_job" "broker" {
  jobspec = file("${path.module}/gpu-broker.nomad.hcl")

  hcl2 {
    vars = {
      namespace     = var.broker.namespace
      count         = tostring(var.broker.count)
      datacenters   = jsonencode(var.broker.datacenters)
      node_pool     = var.broker.node_pool
      driver        = var.broker.driver
      binary        = var.broker.binary
      url           = var.broker.url
      sha256        = var.broker.sha256
      port          = tostring(var.broker.port)
      nomad_address = var.broker.nomad_address
      consul_addr   = var.broker.consul_addr
      kv_prefix     = var.kv_prefix
      enforcement   = var.enforcement
      policies      = jsonencode(local.policies)
      tls           = tostring(var.broker_tls != null)
    }
  }

  depends_on = [nomad_variable.broker, nomad_namespace.tenant, nomad_scheduler_config.gpu]
}
