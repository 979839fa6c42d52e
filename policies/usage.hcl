# How GPU use is measured: a GPU sampled below idle_below % utilisation is
# idle. Right-sizing (gpu-broker usage -rightsizing, and the warning a job
# submitted again gets) counts the GPUs at or above it as busy.
usage {
  idle_below = 5
}

# GPU-hours are kept per day (nomad-gpu/usage/<day> in Consul KV) this long.
# Days are written in hours: 400 days is 9600h.
# usage { retention = "9600h" }

# Prices for usage reports (gpu-broker usage -from ...), per allocated GPU-hour.
currency = "USD"

# Queue order by each tenant's recent GPU-hours per guaranteed GPU: a tenant
# that held many GPUs yesterday yields to one that held few.
fair_share {
  half_life   = "24h"
  idle_weight = 1.0
}

# Who may grant approvals (gpu-broker approval grant ID): token names, or
# "role:<name>" / "policy:<name>" a token holds. Nobody grants their own.
approvers = ["ops-oncall"]
