# How GPU use is measured: a GPU sampled below idle_below % utilisation is
# idle. Right-sizing (gpu-broker usage -rightsizing, and the warning a job
# submitted again gets) counts the GPUs at or above it as busy.
usage {
  idle_below = 5
}
