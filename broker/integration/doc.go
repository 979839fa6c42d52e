// Package integration holds the broker's tests against real Nomad and Consul
// agents and the real nomad CLI; it has no code of its own.
package integration
