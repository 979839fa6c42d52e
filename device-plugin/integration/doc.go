// Package integration holds the device plugin's tests against real Nomad agents
// (built by `make tools`); it has no code of its own.
package integration
