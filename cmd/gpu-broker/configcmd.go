package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/nomad-gpu/nomad-gpu/broker/config"
)

// validateConfig checks a broker configuration file as serve reads it
// (config.Load: the file, the environment it falls back on, the defaults
// and the validation), as nomad config validate does, and starts nothing.
func validateConfig(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("config validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: gpu-broker config validate FILE")
		return 2
	}
	c, err := config.Load(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: valid: listen %s, advertise %s, nomad %s, consul %s, policies in %s, enforcement %s, %d more regions\n",
		fs.Arg(0), c.Listen, c.Advertise, c.Nomad.Address, c.Consul.Address, c.PolicyDir, c.Enforcement, len(c.Regions))
	return 0
}
