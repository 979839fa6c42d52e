terraform {
  required_version = ">= 1.6.0"

  required_providers {
    nomad = {
      source  = "hashicorp/nomad"
      version = ">= 2.1.0"
    }
    consul = {
      source  = "hashicorp/consul"
      version = ">= 2.20.0"
    }
  }
}
