package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
	"github.com/nomad-gpu/nomad-gpu/testing/tools"
)

// TestTLSEverywhere: Nomad serves its API over TLS, Consul over HTTPS, and
// the broker its own listener, all with a CA made at run time. The broker
// follows Nomad, admits, queues in Consul and admits from the queue, and
// users reach it with the nomad and gpu-broker CLIs trusting the CA.
func TestTLSEverywhere(t *testing.T) {
	t.Parallel()
	certs := testcluster.NewCerts(t)
	consul := testcluster.StartTLSConsul(t, certs)
	n := testcluster.StartNomad(t, testcluster.NomadOptions{Name: "tls", Server: true, Client: true, TLS: certs, PluginConfig: `
    backend = "fake"
    fake {
      count     = 4
      id_prefix = "tls"
    }`})
	n.WaitForNodes(t, 1)
	if !strings.HasPrefix(n.Addr, "https://") || !strings.HasPrefix(consul.HTTPSAddr, "https://") {
		t.Fatalf("not TLS: nomad %s, consul %s", n.Addr, consul.HTTPSAddr)
	}
	e := &env{t: t, nomad: n, dir: t.TempDir(), policyDir: t.TempDir()}
	writeFile(t, filepath.Join(e.policyDir, "policy.hcl"), twoTenantPolicy)
	if _, err := n.API.Namespaces().Register(&api.Namespace{Name: "vision"}, nil); err != nil {
		t.Fatal(err)
	}
	// Two brokers: one of them sends its GPU requests to the other, the
	// leader, over TLS too.
	opts := testcluster.BrokerOptions{TLS: certs, ConsulTLS: certs}
	brokers := []*testcluster.Broker{
		testcluster.StartBrokerWith(t, n, consul, e.policyDir, opts),
		testcluster.StartBrokerWith(t, n, consul, e.policyDir, opts),
	}
	e.broker = brokers[0]
	cli := func(args ...string) (string, error) {
		cmd := exec.Command(tools.Binary(t, "nomad"), args...)
		cmd.Env = append(os.Environ(), "NOMAD_ADDR="+e.broker.Addr, "NOMAD_CACERT="+certs.CAFile)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, b := range brokers {
		e.broker = b
		waitForView(t, 4, func() string {
			out, _ := cli("job", "run", e.spec("vision", "probe", 1, 5, ""))
			return out
		})
	}
	e.broker = brokers[0]
	if out, err := cli("job", "run", "-detach", e.spec("vision", "first", 1, 2, "")); err != nil || !strings.Contains(out, "admitted") {
		t.Fatalf("%v\n%s", err, out)
	}
	e.broker = brokers[1]
	out, err := cli("job", "run", "-detach", e.spec("vision", "waits", 1, 2, ""))
	if err != nil || !strings.Contains(out, "queued as ") {
		t.Fatalf("%v\n%s", err, out)
	}
	id := strings.TrimSuffix(strings.Fields(out[strings.Index(out, "queued as ")+len("queued as "):])[0], ",")
	show, err := exec.Command(testcluster.BrokerBinary(t), "queue", "show", id, "-address", e.broker.Addr, "-ca-cert", certs.CAFile).CombinedOutput()
	if err != nil || !strings.Contains(string(show), "waits") {
		t.Fatalf("gpu-broker queue show over TLS: %v\n%s", err, show)
	}
	if out, err := cli("job", "stop", "-namespace", "vision", "-detach", "first"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	e.waitAdmitted(t, "vision", "waits", 60*time.Second)
}
