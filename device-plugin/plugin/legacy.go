package plugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hashicorp/hcl"
	"github.com/hashicorp/hcl/hcl/ast"
)

// NDNName is the name nomad-device-nvidia's binary gives itself in Nomad: a
// client config written for it has a `plugin "nomad-device-nvidia"` block,
// which Nomad ignores once that binary is gone from its plugin_dir.
const NDNName = "nomad-device-nvidia"

// ndnOptions are nomad-device-nvidia v1.1.0's options, each one of ours with
// the same meaning.
var ndnOptions = []string{"enabled", "fingerprint_period", "ignored_gpu_ids"}

// ndnBeside reports whether nomad-device-nvidia's binary is in the plugin
// directory beside this one (self): a file of its name that is not self,
// which it is when this binary was installed under that name.
func ndnBeside(self string, stat func(string) (os.FileInfo, error)) bool {
	other, err := stat(filepath.Join(filepath.Dir(self), NDNName))
	if err != nil {
		return false
	}
	me, err := stat(self)
	return err != nil || !os.SameFile(me, other)
}

// AgentArgs is the command line and working directory of the Nomad agent
// that launched the plugin (its parent), to read the config files it was
// given; an error when there is none to read.
type AgentArgs func() (args []string, cwd string, err error)

// ParentAgent reads the parent process's command line from /proc.
func ParentAgent() ([]string, string, error) {
	ppid := os.Getppid()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", ppid))
	if err != nil {
		return nil, "", err
	}
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", ppid))
	if err != nil {
		return nil, "", err
	}
	return strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00"), cwd, nil
}

// pluginBlock is one `plugin "<name>"` block of the agent's config.
type pluginBlock struct {
	at      string // file:line
	options []option
}

// option is one attribute of a plugin block's config block.
type option struct {
	name, at string
	value    ast.Node
}

// agentPlugins reads the plugin blocks of the config files an agent command
// line (`nomad agent -config PATH ...`) names, as Nomad loads them (HCL 1 or
// JSON). A file it cannot read or parse is an error of its own; the others
// are still read.
func agentPlugins(args []string, cwd string) (map[string][]pluginBlock, []error) {
	if !slices.Contains(args, "agent") {
		return nil, nil
	}
	files, errs := configFiles(args, cwd)
	out := map[string][]pluginBlock{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		file, err := hcl.ParseBytes(src)
		if err != nil {
			errs = append(errs, fmt.Errorf("read agent config %s: %w", f, err))
			continue
		}
		if list, ok := file.Node.(*ast.ObjectList); ok {
			for _, item := range list.Filter("plugin").Items {
				if len(item.Keys) > 0 {
					name, _ := item.Keys[0].Token.Value().(string)
					out[name] = append(out[name], readPluginBlock(f, item))
				}
			}
		}
	}
	return out, errs
}

// configFiles are the files of an agent's -config flags: a file, or the .hcl
// and .json files of a directory, in name order.
func configFiles(args []string, cwd string) ([]string, []error) {
	var files []string
	var errs []error
	for i := 0; i < len(args); i++ {
		name, p, inline := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if !strings.HasPrefix(args[i], "-") || name != "config" {
			continue
		}
		if !inline && i+1 < len(args) {
			i++
			p = args[i]
		}
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		st, err := os.Stat(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range entries { // ReadDir sorts by name, as Nomad loads them
			if n := e.Name(); !e.IsDir() && !strings.HasPrefix(n, ".") && (strings.HasSuffix(n, ".hcl") || strings.HasSuffix(n, ".json")) {
				files = append(files, filepath.Join(p, n))
			}
		}
	}
	return files, errs
}

// readPluginBlock reads the config options of one plugin block of file f
// (item: its keys after "plugin").
func readPluginBlock(f string, item *ast.ObjectItem) pluginBlock {
	b := pluginBlock{at: fmt.Sprintf("%s:%d", f, item.Pos().Line)}
	// JSON's objects come flattened: "plugin" "name" "config" can be one
	// item's keys.
	var configs []ast.Node
	switch rest := item.Keys[1:]; {
	case len(rest) == 1 && rest[0].Token.Value() == "config":
		configs = append(configs, item.Val)
	case len(rest) == 0:
		if body, ok := item.Val.(*ast.ObjectType); ok {
			for _, c := range body.List.Filter("config").Items {
				configs = append(configs, c.Val)
			}
		}
	}
	for _, c := range configs {
		if l, ok := c.(*ast.ListType); ok && len(l.List) == 1 { // JSON: "config": [{...}]
			c = l.List[0]
		}
		inner, ok := c.(*ast.ObjectType)
		if !ok {
			continue
		}
		for _, o := range inner.List.Items {
			if len(o.Keys) > 0 {
				key, _ := o.Keys[0].Token.Value().(string)
				b.options = append(b.options, option{name: key, at: fmt.Sprintf("%s:%d", f, o.Pos().Line), value: o.Val})
			}
		}
	}
	return b
}

// adoptNDN applies the options of a `plugin "nomad-device-nvidia"` block to
// cfg, each one that the plugin's own block (own, the binary's name) does not
// set. So a config written for nomad-device-nvidia keeps its ignored_gpu_ids
// when the binary is replaced, rather than losing them without a word.
// ndnBeside says nomad-device-nvidia's binary is in the plugin directory
// too: the block is its own then, and both would report the same GPUs.
// notes are what the operator should read (logged as warnings).
func adoptNDN(cfg Config, blocks map[string][]pluginBlock, own string, ndnBeside bool) (Config, []string, error) {
	ndn := blocks[NDNName]
	if len(ndn) == 0 || own == NDNName {
		// Installed under nomad-device-nvidia's file name, the binary gets
		// that block from Nomad itself: Nomad gives an external plugin the
		// block named as its file.
		return cfg, nil, nil
	}
	at := ndn[0].at
	if ndnBeside {
		return cfg, []string{fmt.Sprintf("%s and %s are both in the plugin directory: both report the same NVIDIA GPUs to Nomad, and the %q block (%s) applies to %s only; remove one of them",
			own, NDNName, NDNName, at, NDNName)}, nil
	}
	set := map[string]bool{}
	for _, b := range blocks[own] {
		for _, o := range b.options {
			set[o.name] = true
		}
	}
	notes := []string{fmt.Sprintf("the client config's plugin %q block (%s) is applied to %s, which replaces it: rename it to plugin %q", NDNName, at, own, own)}
	var errs []error
	for _, b := range ndn {
		for _, o := range b.options {
			switch {
			case !slices.Contains(ndnOptions, o.name):
				notes = append(notes, fmt.Sprintf("plugin %q option %s (%s) is not one of nomad-device-nvidia's, and is ignored", NDNName, o.name, o.at))
			case set[o.name]:
				notes = append(notes, fmt.Sprintf("plugin %q option %s (%s) is ignored: plugin %q sets it", NDNName, o.name, o.at, own))
			default:
				if err := setOption(&cfg, o); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return cfg, notes, err
	}
	return cfg, notes, cfg.Validate()
}

// setOption sets one of ndnOptions as Nomad's HCL 1 decoder reads it.
func setOption(cfg *Config, o option) error {
	var dst any
	switch o.name {
	case "enabled":
		dst = &cfg.Enabled
	case "fingerprint_period":
		dst = &cfg.FingerprintPeriod
	case "ignored_gpu_ids":
		cfg.IgnoredGPUIDs = nil
		dst = &cfg.IgnoredGPUIDs
	}
	if err := hcl.DecodeObject(dst, o.value); err != nil {
		return fmt.Errorf("plugin %q option %s (%s): %w", NDNName, o.name, o.at, err)
	}
	return nil
}
