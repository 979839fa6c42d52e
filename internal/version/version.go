// Package version is what the two programs say they are. A release sets
// Version and Commit at link time (-ldflags -X, see scripts/release.sh);
// a plain `go build` says it is a development build.
package version

import (
	"fmt"
	"runtime"
)

var (
	// Version is the release's version, without a leading v.
	Version = "0.1.0-dev"
	// Commit is the git commit the binary was built from.
	Commit = "unknown"
)

// String is the -version line: name, version, commit and Go version.
func String(name string) string {
	return fmt.Sprintf("%s v%s (commit %s, %s)", name, Version, Commit, runtime.Version())
}

// Asked reports whether args ask for the version, as HashiCorp's binaries
// take it: `version`, `-version` or `--version` alone.
func Asked(args []string) bool {
	return len(args) == 1 && (args[0] == "version" || args[0] == "-version" || args[0] == "--version" || args[0] == "-v")
}
