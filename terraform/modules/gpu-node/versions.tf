terraform {
  # Provider-free: everything here is rendered with built-in functions, so the
  # module plans and applies without downloading anything.
  required_version = ">= 1.6.0"
}
