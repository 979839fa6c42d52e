// Command notices writes the third-party notices of Go binaries: every
// module linked into them (from their build information), each with its
// licence, then the licence and notice texts from the module cache, Go's
// own first. A module with no licence file there is an error: a release
// must not ship code whose terms it cannot name.
//
//	go run ./scripts/notices BINARY... > THIRD_PARTY_NOTICES.txt
package main

import (
	"bytes"
	"debug/buildinfo"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/mod/module"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: notices BINARY... > THIRD_PARTY_NOTICES.txt")
		os.Exit(2)
	}
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "notices:", err)
		os.Exit(1)
	}
}

// component is one body of code linked in, and its licence and notice texts.
type component struct {
	path, version string
	texts         []text
}

type text struct{ name, body string }

func run(binaries []string, w io.Writer) error {
	env, err := exec.Command("go", "env", "GOMODCACHE", "GOROOT").Output()
	if err != nil {
		return fmt.Errorf("go env: %w", err)
	}
	cache, goroot, _ := strings.Cut(strings.TrimSpace(string(env)), "\n")
	var comps []component
	seen := map[string]bool{}
	var names []string
	for _, bin := range binaries {
		info, err := buildinfo.ReadFile(bin)
		if err != nil {
			return fmt.Errorf("read the build information of %s: %w", bin, err)
		}
		names = append(names, filepath.Base(bin))
		if !seen["go"] {
			seen["go"] = true
			texts, err := licenceTexts(goroot)
			if err != nil {
				return fmt.Errorf("the licence of Go %s: %w", info.GoVersion, err)
			}
			comps = append(comps, component{"Go (its standard library and runtime)", info.GoVersion, texts})
		}
		var mods []component
		for _, d := range info.Deps {
			if d.Replace != nil {
				d = d.Replace
			}
			key := d.Path + "@" + d.Version
			if seen[key] {
				continue
			}
			seen[key] = true
			dir, err := moduleDir(cache, d.Path, d.Version)
			if err != nil {
				return err
			}
			texts, err := licenceTexts(dir)
			if err != nil {
				return fmt.Errorf("%s %s: %w", d.Path, d.Version, err)
			}
			if h, ok := nvmlHeader(dir); ok {
				texts = append(texts, h)
			}
			mods = append(mods, component{d.Path, d.Version, texts})
		}
		slices.SortFunc(mods, func(a, b component) int { return strings.Compare(a.path, b.path) })
		comps = append(comps, mods...)
	}
	fmt.Fprintf(w, "Third-party software in %s\n\n", strings.Join(names, ", "))
	fmt.Fprintf(w, "These binaries are MPL-2.0 (LICENSE.txt) and include the software below, each under\nthe licence named beside it; its licence and notice texts follow in full.\n\n")
	for _, c := range comps {
		fmt.Fprintf(w, "%s %s: %s\n", c.path, c.version, kinds(c.texts))
	}
	for _, c := range comps {
		for _, t := range c.texts {
			fmt.Fprintf(w, "\n%s\n%s %s: %s\n%s\n%s\n", strings.Repeat("=", 78), c.path, c.version, t.name, strings.Repeat("-", 78), strings.TrimRight(t.body, "\n"))
		}
	}
	return nil
}

// moduleDir is where the module cache holds path at version.
func moduleDir(cache, path, version string) (string, error) {
	p, err := module.EscapePath(path)
	if err != nil {
		return "", fmt.Errorf("module %s: %w", path, err)
	}
	v, err := module.EscapeVersion(version)
	if err != nil {
		return "", fmt.Errorf("module %s version %s: %w", path, version, err)
	}
	dir := filepath.Join(cache, p+"@"+v)
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("module %s %s is not in the module cache (go mod download): %w", path, version, err)
	}
	return dir, nil
}

// licenceFile names a module's licence and notice files.
var licenceFile = regexp.MustCompile(`(?i)^(licen[cs]e|copying|notice|patents)([-._].*)?$`)

// licenceTexts are the licence and notice files at the top of dir.
func licenceTexts(dir string) ([]text, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []text
	for _, e := range entries {
		if e.IsDir() || !licenceFile.MatchString(e.Name()) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, text{e.Name(), string(b)})
	}
	if !slices.ContainsFunc(out, func(t text) bool { return kind(t.body) != "" }) {
		return nil, errors.New("no licence file found (LICENSE, COPYING) that names a known licence")
	}
	return out, nil
}

// nvmlHeader is the licence notice at the top of NVIDIA's nvml.h, which
// go-nvml carries and compiles in.
func nvmlHeader(dir string) (text, bool) {
	b, err := os.ReadFile(filepath.Join(dir, "pkg", "nvml", "nvml.h"))
	if err != nil {
		return text{}, false
	}
	at := bytes.Index(b, []byte("NOTICE TO USER"))
	if at < 0 {
		return text{}, false
	}
	start, end := bytes.LastIndex(b[:at], []byte("/*")), bytes.Index(b[at:], []byte("*/"))
	if start < 0 || end < 0 {
		return text{}, false
	}
	return text{"pkg/nvml/nvml.h (NVIDIA's notice)", string(b[start : at+end+2])}, true
}

// kinds names the licences of texts, by kind.
func kinds(texts []text) string {
	var out []string
	for _, t := range texts {
		if k := kind(t.body); k != "" && !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return strings.Join(out, ", ")
}

// kind is the SPDX identifier of a licence text, by the words each has; ""
// for a notice or a text it does not know.
func kind(body string) string {
	b := strings.Join(strings.Fields(body), " ")
	switch {
	case strings.Contains(b, "Apache License") && strings.Contains(b, "Version 2.0"):
		return "Apache-2.0"
	case strings.Contains(b, "Mozilla Public License") && strings.Contains(b, "2.0"):
		return "MPL-2.0"
	case strings.Contains(b, "Permission is hereby granted, free of charge"):
		return "MIT"
	case strings.Contains(b, "Permission to use, copy, modify, and/or distribute") || strings.Contains(b, "Permission to use, copy, modify, and distribute"):
		return "ISC"
	case strings.Contains(b, "Redistribution and use in source and binary forms") && strings.Contains(b, "Neither the name"):
		return "BSD-3-Clause"
	case strings.Contains(b, "Redistribution and use in source and binary forms"):
		return "BSD-2-Clause"
	}
	return ""
}
