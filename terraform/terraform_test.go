// Package terraform_test applies the provider-free module with a real
// OpenTofu, starts a real Nomad client from what it renders, and runs the
// broker job of cluster-config on a real Nomad. It checks the structure of
// what needs the registry's providers (not reachable here).
package terraform_test

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/nomad/api"
	"github.com/zclconf/go-cty/cty"

	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
	"github.com/nomad-gpu/nomad-gpu/testing/tools"
)

// tofu runs OpenTofu in dir, offline, and returns its standard output.
func tofu(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := tofuRun(t, dir, args...)
	if err != nil {
		t.Fatalf("tofu %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func tofuRun(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	bin := tools.Binary(t, "tofu")
	cliConfig := filepath.Join(t.TempDir(), "tofurc")
	if err := os.WriteFile(cliConfig, []byte("disable_checkpoint = true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "TF_CLI_CONFIG_FILE="+cliConfig, "CHECKPOINT_DISABLE=1",
		"TF_IN_AUTOMATION=1", "TF_INPUT=0", "NO_COLOR=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out) + stderr.String(), err
	}
	return string(out), nil
}

// copyModule copies a module of terraform/modules into a scratch directory, so
// that init and state never land in the checkout.
func copyModule(t *testing.T, name string) string {
	t.Helper()
	src := filepath.Join("modules", name)
	dst := filepath.Join(t.TempDir(), name)
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// outputs applies the root module in dir and returns its outputs' values.
func outputs(t *testing.T, dir string, args ...string) map[string]json.RawMessage {
	t.Helper()
	tofu(t, dir, "init", "-input=false")
	tofu(t, dir, "validate")
	tofu(t, dir, append([]string{"apply", "-auto-approve", "-input=false"}, args...)...)
	var outs map[string]struct{ Value json.RawMessage }
	if err := json.Unmarshal([]byte(tofu(t, dir, "output", "-json")), &outs); err != nil {
		t.Fatal(err)
	}
	values := map[string]json.RawMessage{}
	for k, v := range outs {
		values[k] = v.Value
	}
	return values
}

func str(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

func write(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// With no inputs the module renders a complete node whose configurations the
// real agents accept.
func TestGPUNodeModuleAppliesWithItsDefaults(t *testing.T) {
	nomad, consul := tools.Binary(t, "nomad"), tools.Binary(t, "consul")
	out := outputs(t, copyModule(t, "gpu-node"))

	client := str(t, out["nomad_client_hcl"])
	for _, want := range []string{
		`plugin "nomad-device-gpu"`, `backend            = "auto"`, `disable_update_check = true`,
		`"fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean"`,
		`servers    = ["127.0.0.1:4647"]`, `node_pool  = "gpu"`, `host_volume "checkpoints"`,
	} {
		if !strings.Contains(client, want) {
			t.Errorf("nomad_client_hcl lacks %s:\n%s", want, client)
		}
	}
	dir := t.TempDir()
	if b, err := exec.Command(nomad, "config", "validate", write(t, filepath.Join(dir, "client.hcl"), client)).CombinedOutput(); err != nil {
		t.Errorf("nomad config validate: %v\n%s", err, b)
	}
	if b, err := exec.Command(consul, "validate", write(t, filepath.Join(dir, "consul.hcl"), str(t, out["consul_client_hcl"]))).CombinedOutput(); err != nil {
		t.Errorf("consul validate: %v\n%s", err, b)
	}
	if ci := str(t, out["cloud_init"]); !strings.HasPrefix(ci, "#cloud-config\n") {
		t.Errorf("cloud_init does not start with #cloud-config:\n%s", ci)
	}
	t.Run("the units sit beside HashiCorp's packages'", func(t *testing.T) { checkUnits(t, out) })
}

// A Nomad client is started as the rendered unit starts it, from the
// rendered configuration, beside a server configuration of HashiCorp's nomad
// package's kind in /etc/nomad.d (a one-node server, a client of 127.0.0.1).
// It joins a real server and is no server itself. It loads the plugin with
// GPU sharing, installed into Nomad's own plugin directory
// (<data_dir>/plugins) from a release zip of `make release` by the
// cloud-init command that checks its SHA-256. It offers the host volume for
// checkpoints, and its cloud-init writes exactly the rendered files.
func TestAClientFromTheGPUNodeModuleJoinsAndLoadsThePlugin(t *testing.T) {
	consul := testcluster.StartConsul(t)
	server := testcluster.StartNomad(t, testcluster.NomadOptions{Name: "server", Server: true})
	dir := t.TempDir()
	dataDir, ckpt := filepath.Join(dir, "data"), filepath.Join(dir, "checkpoints")
	pluginDir := filepath.Join(dataDir, "plugins")
	etc := filepath.Join(dir, "etc")
	configDir := filepath.Join(etc, "nomad-gpu", "nomad.d")
	for _, d := range []string{pluginDir, dataDir, ckpt, configDir, filepath.Join(etc, "nomad.d")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dist := t.TempDir()
	zipName := "nomad-device-gpu_" + testcluster.ReleaseVersion + "_linux_amd64.zip"
	sha := testcluster.Release(t, dist, "zip")[zipName]
	ports := testcluster.FreePorts(t, 3)
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	module, _ := filepath.Abs(filepath.Join("modules", "gpu-node"))
	write(t, filepath.Join(root, "main.tf"), fmt.Sprintf(`
module "node" {
  source         = %q
  node_name      = "tf-gpu-1"
  nomad_servers  = [%q]
  nomad_ports    = { http = %d, rpc = %d, serf = %d }
  consul_address = %q
  nomad_data_dir = %q
  nomad_config_dir = %q
  host_volumes   = { checkpoints = { path = %q } }
  plugin_version = %q
  plugin_url     = "file://%s/nomad-device-gpu_{version}_linux_amd64.zip"
  plugin_sha256  = %q
  plugin_config = {
    backend            = "fake"
    fingerprint_period = "5s"
    fake               = { count = 8, id_prefix = "tf" }
  }
  gpu_sharing = { replicas = 4, gpus = 2 }
}

output "nomad_client_hcl" { value = module.node.nomad_client_hcl }
output "nomad_service"    { value = module.node.nomad_service }
output "files"            { value = module.node.files }
output "cloud_init"       { value = yamldecode(trimprefix(module.node.cloud_init, "#cloud-config\n")) }
`, module, server.RPCAddr, ports[0], ports[1], ports[2], consul.Addr, dataDir, configDir, ckpt, testcluster.ReleaseVersion, dist, sha))
	out := outputs(t, root)

	var files map[string]struct{ Content, Permissions string }
	var cloudInit struct {
		WriteFiles []struct{ Path, Content string } `json:"write_files"`
		RunCmd     [][]string                       `json:"runcmd"`
		Packages   []string
	}
	if err := json.Unmarshal(out["files"], &files); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out["cloud_init"], &cloudInit); err != nil {
		t.Fatal(err)
	}
	if len(cloudInit.WriteFiles) != len(files) {
		t.Errorf("cloud-init writes %d files, the module renders %d", len(cloudInit.WriteFiles), len(files))
	}
	for _, f := range cloudInit.WriteFiles {
		if files[f.Path].Content != f.Content {
			t.Errorf("cloud-init's %s differs from the module's", f.Path)
		}
	}
	if last := cloudInit.RunCmd[len(cloudInit.RunCmd)-1]; strings.Join(last, " ") != "systemctl enable --now consul.service nomad.service" {
		t.Errorf("cloud-init ends with %v, want the agents started", last)
	}

	installPlugin(t, cloudInit.RunCmd, cloudInit.Packages, pluginDir, sha)

	// What HashiCorp's nomad package installs: a server configuration in
	// /etc/nomad.d, and /usr/bin/nomad, which the unit runs on its own
	// directory (the tools' nomad stands in for the package's).
	write(t, filepath.Join(etc, "nomad.d", "nomad.hcl"), fmt.Sprintf("data_dir  = %q\nbind_addr = \"0.0.0.0\"\n\nserver {\n  enabled          = true\n  bootstrap_expect = 1\n}\n\nclient {\n  enabled = true\n  servers = [\"127.0.0.1\"]\n}\n", dataDir))
	for _, unit := range []string{str(t, out["nomad_service"]), files["/etc/systemd/system/nomad.service.d/nomad-gpu.conf"].Content} {
		if !strings.Contains(unit, "\nExecStart=/usr/bin/nomad agent -config "+configDir+"\n") {
			t.Errorf("the unit or its drop-in does not run /usr/bin/nomad on %s alone:\n%s", configDir, unit)
		}
	}
	// The module's own units go in only where no package put one, before
	// systemd reads the units again.
	if n := len(cloudInit.RunCmd); n < 4 || !strings.Contains(strings.Join(cloudInit.RunCmd[n-3], " "), "|| install -m 0644 /usr/local/share/nomad-gpu/systemd/nomad.service /etc/systemd/system/nomad.service") {
		t.Errorf("cloud-init does not install the module's nomad.service only where none is, before daemon-reload: %v", cloudInit.RunCmd)
	}
	for path, f := range files {
		if strings.HasPrefix(path, configDir+"/") {
			write(t, path, f.Content)
		}
	}
	client := testcluster.StartClientFromConfig(t, "tf-gpu-1", configDir, fmt.Sprintf("http://127.0.0.1:%d", ports[0]), dataDir)
	node := server.WaitForNodes(t, 1)[0]
	if self, err := client.API.Agent().Self(); err != nil || self.Config["Server"].(map[string]any)["Enabled"] != false {
		t.Errorf("the GPU client runs a server too (%v)", err)
	}
	if peers, err := server.API.Status().Peers(); err != nil || len(peers) != 1 {
		t.Errorf("raft peers %v (%v), want the one server", peers, err)
	}
	if node.Name != "tf-gpu-1" || node.NodePool != "gpu" || node.NodeClass != "gpu" {
		t.Errorf("node %s in pool %q class %q, want tf-gpu-1 in gpu/gpu", node.Name, node.NodePool, node.NodeClass)
	}
	if v, ok := node.HostVolumes["checkpoints"]; !ok || v.Path != ckpt {
		t.Errorf("host volumes %v, want checkpoints at %s", node.HostVolumes, ckpt)
	}
	testcluster.WaitFor(t, 60*time.Second, "6 whole GPUs and 8 replicas", func() error {
		n, _, err := server.API.Nodes().Info(node.ID, nil)
		if err != nil {
			return err
		}
		got := map[string]int{}
		for _, d := range n.NodeResources.Devices {
			got[d.Name] = len(d.Instances)
		}
		want := map[string]int{"NVIDIA H100 80GB HBM3": 6, "NVIDIA H100 80GB HBM3 (shared)": 8}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("device groups %v, want %v", got, want)
		}
		return nil
	})
	testcluster.WaitFor(t, 60*time.Second, "the client registered in Consul", func() error {
		resp, err := http.Get("http://" + consul.Addr + "/v1/catalog/service/nomad-client")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var entries []struct{ ServiceName string }
		if err := json.NewDecoder(resp.Body).Decode(&entries); err != nil {
			return err
		}
		if len(entries) == 0 {
			return fmt.Errorf("no nomad-client service in Consul")
		}
		return nil
	})
}

// installPlugin runs cloud-init's command that installs the plugin, as
// cloud-init would, on this machine: with a wrong SHA-256 in it (what a
// wrong plugin_sha256 renders), it fails and installs nothing; as rendered,
// it installs the release's binary.
func installPlugin(t *testing.T, runcmd [][]string, packages []string, pluginDir, sha string) {
	t.Helper()
	tools.Binary(t, "unzip")
	if strings.Join(packages, " ") != "unzip" {
		t.Errorf("cloud-init installs packages %v, want unzip for a zip", packages)
	}
	var install []string
	for _, c := range runcmd {
		if strings.Contains(strings.Join(c, " "), "sha256sum -c") {
			install = c
		}
	}
	if len(install) != 3 || install[0] != "sh" {
		t.Fatalf("no `sh -c` command that checks the plugin's SHA-256 in runcmd %v", runcmd)
	}
	plugin := filepath.Join(pluginDir, "nomad-device-gpu")
	wrong := strings.Replace(install[2], sha, strings.Repeat("0", 64), 1)
	if out, err := exec.Command("sh", "-c", wrong).CombinedOutput(); err == nil || !strings.Contains(string(out), "FAILED") {
		t.Errorf("with a wrong SHA-256 the install: %v, %s; want it to fail on the check", err, out)
	}
	if left, _ := os.ReadDir(pluginDir); len(left) != 0 {
		t.Errorf("a download that failed its check left %v in plugin_dir", left)
	}
	if out, err := exec.Command("sh", "-c", install[2]).CombinedOutput(); err != nil {
		t.Fatalf("cloud-init's install of the plugin: %v\n%s", err, out)
	}
	out, err := exec.Command(plugin, "-version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "nomad-device-gpu v"+testcluster.ReleaseVersion+" ") {
		t.Errorf("the installed plugin's -version: %v: %s", err, out)
	}
	if left, _ := os.ReadDir(pluginDir); len(left) != 1 {
		t.Errorf("plugin_dir holds %v after the install, want the plugin alone", left)
	}
}

// The tenants that `gpu-broker policy tenants -tfvars` prints are a valid
// value of cluster-config's variable; its locals (provider-free) map each
// namespace to its tenant and pick up the policy files; a namespace in two
// tenants is refused.
func TestClusterConfigVariablesTakeThePolicyTenants(t *testing.T) {
	broker := testcluster.BrokerReleaseBinary(t)
	policies, _ := filepath.Abs("../policies")
	dir := t.TempDir()
	for _, f := range []string{"variables.tf", "locals.tf"} {
		b, err := os.ReadFile(filepath.Join("modules", "cluster-config", f))
		if err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, f), string(b))
	}
	write(t, filepath.Join(dir, "outputs.tf"), `
output "tenant_of" { value = local.tenant_of }
output "policy_files" { value = keys(local.policies) }
`)
	tfvars, err := exec.Command(broker, "policy", "tenants", "-tfvars", policies).Output()
	if err != nil {
		t.Fatalf("gpu-broker policy tenants -tfvars: %v", err)
	}
	vars := write(t, filepath.Join(dir, "tenants.tfvars.json"), string(tfvars))
	out := outputs(t, dir, "-var-file="+vars, "-var=policy_dir="+policies)
	var tenantOf map[string]string
	var policyFiles []string
	if err := json.Unmarshal(out["tenant_of"], &tenantOf); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out["policy_files"], &policyFiles); err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(tenantOf), "map[research:research search:search vision:vision]"; got != want {
		t.Errorf("tenant_of = %s, want %s", got, want)
	}
	files, _ := filepath.Glob(filepath.Join(policies, "*.hcl"))
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	sort.Strings(names)
	if got, want := fmt.Sprint(policyFiles), fmt.Sprint(names); got != want {
		t.Errorf("policy_files = %s, want %s", got, want)
	}

	bad := write(t, filepath.Join(dir, "bad.tfvars.json"),
		`{"tenants": {"a": {"namespaces": ["x"]}, "b": {"namespaces": ["x"]}}}`)
	msg, err := tofuRun(t, dir, "plan", "-input=false", "-var-file="+bad, "-var=policy_dir="+policies)
	if err == nil || !strings.Contains(msg, "A namespace belongs to one tenant only.") {
		t.Errorf("a namespace in two tenants: err %v, output:\n%s", err, msg)
	}
}

// Every OpenTofu file is formatted (the example and cluster-config need the
// registry's providers for anything more).
func TestTerraformIsFormatted(t *testing.T) {
	if out, err := tofuRun(t, ".", "fmt", "-check", "-recursive", "-diff"); err != nil {
		t.Errorf("tofu fmt -check: %v\n%s", err, out)
	}
}

// The broker job that cluster-config registers runs on a real Nomad with a real
// Consul. Nomad downloads the release's zip and checks its SHA-256; its
// tokens and its TLS certificate come from the Nomad variable, its policies
// from the job's templates. It answers as the broker, leader and all, over
// HTTPS on its node's address, metrics included, as a remote Prometheus
// scrapes them; its Consul service says so.
func TestTheBrokerRunsAsANomadJob(t *testing.T) {
	nomadBin := tools.Binary(t, "nomad")
	consul := testcluster.StartConsul(t)
	n := testcluster.StartNomad(t, testcluster.NomadOptions{Name: "dev", Server: true, Client: true,
		ConsulAddr: consul.Addr, PluginConfig: `backend = "fake"`,
		// Tasks' addresses (NOMAD_ADDR_http, where the broker listens) on loopback.
		ClientHCL: `network_interface = "lo"`})
	n.WaitForNodes(t, 1)
	certs := testcluster.NewCerts(t)
	pem := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if _, _, err := n.API.Variables().Create(&api.Variable{Path: "nomad/jobs/gpu-broker",
		Items: api.VariableItems{"nomad_token": "not-used-without-acls", "consul_token": "not-used-without-acls",
			"tls_cert": pem(certs.CertFile), "tls_key": pem(certs.KeyFile)}}, nil); err != nil {
		t.Fatalf("nomad var put: %v", err)
	}
	policies := map[string]string{}
	files, _ := filepath.Glob("../policies/*.hcl")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		policies[filepath.Base(f)] = string(b)
	}
	policyJSON, _ := json.Marshal(policies)
	port := testcluster.FreePorts(t, 1)[0]
	zipURL, zipSum := serveReleaseZip(t, "gpu-broker", testcluster.BrokerReleaseBinary(t))
	cmd := exec.Command(nomadBin, "job", "run", "-detach",
		"-var", "count=1", "-var", "driver=raw_exec", "-var", "url="+zipURL, "-var", "sha256="+zipSum, "-var", "tls=true",
		"-var", fmt.Sprintf("port=%d", port), "-var", "nomad_address="+n.Addr, "-var", "consul_addr="+consul.Addr,
		"-var", "policies="+string(policyJSON), filepath.Join("modules", "cluster-config", "gpu-broker.nomad.hcl"))
	cmd.Env = append(os.Environ(), "NOMAD_ADDR="+n.Addr)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nomad job run gpu-broker.nomad.hcl: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, stream := range []string{"-stdout", "-stderr"} {
				logs := exec.Command(nomadBin, "alloc", "logs", stream, "-job", "gpu-broker")
				logs.Env = cmd.Env
				out, _ := logs.CombinedOutput()
				t.Logf("gpu-broker %s:\n%s", stream, out)
			}
		}
	})
	broker, https := fmt.Sprintf("https://127.0.0.1:%d", port), certs.Client()
	testcluster.WaitFor(t, 90*time.Second, "the broker job's leader answering /v1/gpu/queue", func() error {
		resp, err := https.Get(broker + "/v1/gpu/queue")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /v1/gpu/queue: %s", resp.Status)
		}
		return nil
	})
	metrics, err := https.Get(broker + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(metrics.Body)
	metrics.Body.Close()
	if metrics.StatusCode != http.StatusOK || !strings.Contains(string(body), "nomadgpu_") {
		t.Errorf("GET /metrics over HTTPS: %s\n%.300s", metrics.Status, body)
	}
	if plain, err := http.Get(strings.Replace(broker, "https:", "http:", 1) + "/metrics"); err == nil {
		if plain.Body.Close(); plain.StatusCode == http.StatusOK {
			t.Errorf("the broker answers /metrics over plain HTTP too")
		}
	}
	testcluster.WaitFor(t, 60*time.Second, "the gpu-broker service in Consul, passing over HTTPS, meta metrics_scheme https", func() error {
		resp, err := http.Get("http://" + consul.Addr + "/v1/health/service/gpu-broker?passing=true")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var entries []struct {
			Service struct{ Meta map[string]string }
		}
		if err := json.NewDecoder(resp.Body).Decode(&entries); err != nil {
			return err
		}
		if len(entries) != 1 || entries[0].Service.Meta["metrics_scheme"] != "https" || entries[0].Service.Meta["metrics_path"] != "/metrics" {
			return fmt.Errorf("passing instances %+v", entries)
		}
		return nil
	})
	resp, err := https.Get(broker + "/v1/gpu/usage")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rows []struct{ Tenant string }
	if err := json.NewDecoder(resp.Body).Decode(&rows); err != nil {
		t.Fatal(err)
	}
	var tenants []string
	for _, r := range rows {
		tenants = append(tenants, r.Tenant)
	}
	sort.Strings(tenants)
	if got := strings.Join(tenants, ","); got != "research,search,vision" {
		t.Errorf("the broker job's tenants: %s, want research,search,vision (from the templated policies)", got)
	}
	testcluster.WaitFor(t, 60*time.Second, "gpu-broker healthy in Consul", func() error {
		resp, err := http.Get("http://" + consul.Addr + "/v1/health/service/gpu-broker?passing=true")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var entries []json.RawMessage
		if err := json.NewDecoder(resp.Body).Decode(&entries); err != nil {
			return err
		}
		if len(entries) != 1 {
			return fmt.Errorf("%d passing gpu-broker instances", len(entries))
		}
		return nil
	})
}

// cluster-config's structure, read with hcl/v2 since its providers cannot be
// downloaded here: the resources an operator relies on, preemption on for
// every scheduler, a management token for the broker, and a broker job given
// exactly the variables its jobspec declares.
func TestClusterConfigStructure(t *testing.T) {
	dir := filepath.Join("modules", "cluster-config")
	parser := hclparse.NewParser()
	blocks := map[string]*hclsyntax.Block{} // "<type>.<name>"
	declared := map[string]bool{}           // the module's variables
	files, _ := filepath.Glob(filepath.Join(dir, "*.tf"))
	for _, f := range files {
		file, diags := parser.ParseHCLFile(f)
		if diags.HasErrors() {
			t.Fatal(diags)
		}
		for _, b := range file.Body.(*hclsyntax.Body).Blocks {
			switch b.Type {
			case "resource", "data":
				blocks[b.Labels[0]+"."+b.Labels[1]] = b
			case "variable":
				declared[b.Labels[0]] = true
			}
		}
	}
	for _, want := range []string{"nomad_namespace.tenant", "nomad_scheduler_config.gpu", "nomad_acl_policy.users",
		"nomad_acl_role.users", "nomad_acl_token.broker", "consul_acl_policy.broker", "consul_acl_token.broker",
		"nomad_variable.broker", "nomad_job.broker"} {
		if blocks[want] == nil {
			t.Errorf("cluster-config has no %s", want)
		}
	}
	// Every var.X the module reads is declared.
	for _, b := range blocks {
		for _, v := range hclsyntax.Variables(exprsOf(b.Body)) {
			if v.RootName() == "var" {
				name := v[1].(hcl.TraverseAttr).Name
				if !declared[name] {
					t.Errorf("%s reads var.%s, which variables.tf does not declare", b.Range(), name)
				}
			}
		}
	}
	value := func(block, attr string) cty.Value {
		t.Helper()
		b := blocks[block]
		if b == nil {
			t.Fatalf("no %s", block)
		}
		a := b.Body.Attributes[attr]
		if a == nil {
			t.Fatalf("%s has no %s", block, attr)
		}
		v, diags := a.Expr.Value(nil)
		if diags.HasErrors() {
			t.Fatalf("%s.%s: %v", block, attr, diags)
		}
		return v
	}
	for k, v := range value("nomad_scheduler_config.gpu", "preemption_config").AsValueMap() {
		if v.True() != true {
			t.Errorf("preemption_config.%s is off: borrowed GPU jobs would never be preempted", k)
		}
	}
	if got := value("nomad_acl_token.broker", "type").AsString(); got != "management" {
		t.Errorf("the broker's Nomad token is %q, want management (it reads submitters' tokens by accessor)", got)
	}
	if got := value("nomad_variable.broker", "path").AsString(); got != "nomad/jobs/gpu-broker" {
		t.Errorf("the broker's variable is at %s: the job (gpu-broker) could not read it", got)
	}

	// The broker job gets exactly its jobspec's variables, every required one.
	var hcl2 *hclsyntax.Block
	for _, b := range blocks["nomad_job.broker"].Body.Blocks {
		if b.Type == "hcl2" {
			hcl2 = b
		}
	}
	if hcl2 == nil || hcl2.Body.Attributes["vars"] == nil {
		t.Fatal("nomad_job.broker has no hcl2 { vars }")
	}
	passed := map[string]bool{}
	for _, item := range hcl2.Body.Attributes["vars"].Expr.(*hclsyntax.ObjectConsExpr).Items {
		key, diags := item.KeyExpr.Value(nil)
		if diags.HasErrors() {
			t.Fatal(diags)
		}
		passed[key.AsString()] = true
	}
	spec, diags := parser.ParseHCLFile(filepath.Join(dir, "gpu-broker.nomad.hcl"))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	for _, b := range spec.Body.(*hclsyntax.Body).Blocks {
		if b.Type != "variable" {
			continue
		}
		name := b.Labels[0]
		if _, hasDefault := b.Body.Attributes["default"]; !hasDefault && !passed[name] {
			t.Errorf("the jobspec's variable %q has no default and nomad_job.broker does not pass it", name)
		}
		delete(passed, name)
	}
	for name := range passed {
		t.Errorf("nomad_job.broker passes %q, which the jobspec does not declare (Nomad refuses the job)", name)
	}
}

// exprsOf is every expression in a body, nested blocks included, as one
// expression for hclsyntax.Variables.
func exprsOf(body *hclsyntax.Body) hclsyntax.Expression {
	var items []hclsyntax.Expression
	for _, a := range body.Attributes {
		items = append(items, a.Expr)
	}
	for _, b := range body.Blocks {
		items = append(items, exprsOf(b.Body))
	}
	return &hclsyntax.TupleConsExpr{Exprs: items}
}

// serveReleaseZip serves a zip laid out as the release's (the binary at bin
// as name, at its top, with LICENSE.txt) over HTTP on loopback, and returns
// its URL and SHA-256.
func serveReleaseZip(t *testing.T, name, bin string) (url, sum string) {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for file, src := range map[string]string{name: bin, "LICENSE.txt": "../LICENSE"} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		h := &zip.FileHeader{Name: file, Method: zip.Deflate}
		h.SetMode(0o755)
		w, err := zw.CreateHeader(h)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(b)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	body := buf.Bytes()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(body) }))
	t.Cleanup(srv.Close)
	h := sha256.Sum256(body)
	return srv.URL + "/" + name + "_" + testcluster.ReleaseVersion + "_linux_amd64.zip", hex.EncodeToString(h[:])
}
