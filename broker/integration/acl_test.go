package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/gpuapi"
	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
	"github.com/nomad-gpu/nomad-gpu/testing/tools"
)

// The Nomad ACL policies docs/broker.md documents for exclusive enforcement: users
// read, follow logs, exec and restart in their namespace, and write nothing.
const exclusiveUserRules = `
namespace "vision" {
  policy       = "read"
  capabilities = ["read-logs", "read-fs", "alloc-exec", "alloc-lifecycle"]
}
node {
  policy = "read"
}
`

const aclPolicy = `
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
  submitters = ["role:vision-ml"]
}
borrowing {
  enabled = false
}
`

// aclEnv is a user of an ACL-enabled cluster: the nomad and gpu-broker CLIs
// with a token, against the broker (over TLS) or Nomad itself.
type aclEnv struct {
	*env
	certs *testcluster.Certs
}

// in is e bound to a subtest's t, as env.in.
func (e *aclEnv) in(t *testing.T) *aclEnv {
	return &aclEnv{env: e.env.in(t), certs: e.certs}
}

func (e *aclEnv) cli(token, addr string, args ...string) (string, error) {
	cmd := exec.Command(tools.Binary(e.t, "nomad"), args...)
	cmd.Env = append(os.Environ(), "NOMAD_ADDR="+addr, "NOMAD_TOKEN="+token)
	if e.certs != nil {
		cmd.Env = append(cmd.Env, "NOMAD_CACERT="+e.certs.CAFile)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (e *aclEnv) brokerAPI(token, method, path string) (int, string) {
	req, _ := http.NewRequest(method, e.broker.Addr+path, nil)
	if token != "" {
		req.Header.Set("X-Nomad-Token", token)
	}
	resp, err := e.broker.Client.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// startACLCluster starts Consul and a Nomad agent with ACLs on, 4 fake GPUs,
// namespaces vision and search and the given ACL policies, bootstrapped (its
// API client holds the management token); token creates ACL tokens.
func startACLCluster(t *testing.T, policies map[string]string) (*testcluster.Nomad, *testcluster.Consul, func(name, typ string, roles, policies []string) *api.ACLToken) {
	consul := testcluster.StartConsul(t)
	n := testcluster.LaunchNomad(t, testcluster.NomadOptions{Name: "acl", Server: true, Client: true, ConsulAddr: consul.Addr,
		ExtraHCL: "acl {\n  enabled = true\n}", PluginConfig: `
    backend = "fake"
    fake {
      count     = 4
      id_prefix = "acl"
    }`})
	var boot *api.ACLToken
	testcluster.WaitFor(t, 90*time.Second, "ACL bootstrap", func() error {
		if n.Exited() {
			t.Fatalf("nomad exited:\n%s", n.Log())
		}
		var err error
		boot, _, err = n.API.ACLTokens().Bootstrap(nil)
		return err
	})
	n.API.SetSecretID(boot.SecretID)
	n.WaitForNodes(t, 1)
	for _, ns := range []string{"vision", "search"} {
		if _, err := n.API.Namespaces().Register(&api.Namespace{Name: ns}, nil); err != nil {
			t.Fatal(err)
		}
	}
	for name, rules := range policies {
		if _, err := n.API.ACLPolicies().Upsert(&api.ACLPolicy{Name: name, Rules: rules}, nil); err != nil {
			t.Fatal(err)
		}
	}
	return n, consul, func(name, typ string, roles, policies []string) *api.ACLToken {
		tok := &api.ACLToken{Name: name, Type: typ, Policies: policies}
		for _, r := range roles {
			tok.Roles = append(tok.Roles, &api.ACLTokenRoleLink{Name: r})
		}
		out, _, err := n.API.ACLTokens().Create(tok, nil)
		if err != nil {
			t.Fatalf("token %s: %v", name, err)
		}
		return out
	}
}

// TestExclusiveEnforcementWithNomadACLs walks the paths of issue 6 §2 and §3
// with Nomad's ACLs on: users hold read rights only, the broker (serving TLS)
// writes for the tenant's submitters with its own token.
func TestExclusiveEnforcementWithNomadACLs(t *testing.T) {
	t.Parallel()
	n, consul, token := startACLCluster(t, map[string]string{"vision-user": exclusiveUserRules})
	if _, _, err := n.API.ACLRoles().Create(&api.ACLRole{Name: "vision-ml", Policies: []*api.ACLRolePolicyLink{{Name: "vision-user"}}}, nil); err != nil {
		t.Fatal(err)
	}
	ana := token("ana", "client", []string{"vision-ml"}, nil)   // a submitter
	cai := token("cai", "client", []string{"vision-ml"}, nil)   // another
	bob := token("bob", "client", nil, []string{"vision-user"}) // reads vision, not a submitter
	brokerToken := token("gpu-broker", "management", nil, nil)  // reads other tokens: management only
	policyDir := t.TempDir()
	writeFile(t, filepath.Join(policyDir, "policy.hcl"), aclPolicy)
	certs := testcluster.NewCerts(t)
	e := &aclEnv{env: &env{t: t, nomad: n, dir: t.TempDir(), policyDir: policyDir}, certs: certs}
	e.broker = testcluster.StartBrokerWith(t, n, consul, policyDir, testcluster.BrokerOptions{
		Token: brokerToken.SecretID, TokenFile: true, Config: `enforcement = "exclusive"`, TLS: certs})
	if !strings.HasPrefix(e.broker.Addr, "https://") {
		t.Fatalf("broker does not serve TLS: %s", e.broker.Addr)
	}
	waitForView(t, 4, func() string {
		out, _ := e.cli(ana.SecretID, e.broker.Addr, "job", "plan", e.spec("vision", "probe", 1, 5, ""))
		return out
	})

	t.Run("a submitter's direct nomad job run is refused by Nomad", func(t *testing.T) {
		e := e.in(t)
		out, err := e.cli(ana.SecretID, n.Addr, "job", "run", e.spec("vision", "direct", 1, 1, ""))
		if err == nil || !strings.Contains(out, "Permission denied") {
			t.Fatalf("Nomad took a user's write: %v\n%s", err, out)
		}
	})
	t.Run("the same through the broker runs, written by the broker", func(t *testing.T) {
		e := e.in(t)
		out, err := e.cli(ana.SecretID, e.broker.Addr, "job", "run", e.spec("vision", "direct", 1, 1, ""))
		if err != nil || !strings.Contains(out, "nomad-gpu: admitted: tenant vision") {
			t.Fatalf("%v\n%s", err, out)
		}
		job := e.job("vision", "direct")
		if *job.Priority != 60 || job.Meta["nomad-gpu.tenant"] != "vision" {
			t.Errorf("priority %d, meta %v", *job.Priority, job.Meta)
		}
		e.waitRunning("vision", "direct")
	})
	used := func(want float64) { // vision's GPUs as the broker counts them, read with ana's token
		t.Helper()
		testcluster.WaitFor(t, 60*time.Second, fmt.Sprintf("vision using %g GPUs", want), func() error {
			var rows []gpuapi.TenantUsage
			status, body := e.brokerAPI(ana.SecretID, http.MethodGet, "/v1/gpu/usage")
			if err := json.Unmarshal([]byte(body), &rows); status != http.StatusOK || err != nil {
				return fmt.Errorf("%d %s", status, body)
			}
			for _, r := range rows {
				if r.Tenant == "vision" && r.Used != want {
					return fmt.Errorf("%g used", r.Used)
				}
			}
			return nil
		})
	}
	// E1 with exclusive enforcement: a submitter's dead job (its
	// allocations failed) holds nothing; evaluated with failed allocations
	// forced to reschedule, through the broker, it would run again beside
	// the limit the tenant filled meanwhile. Refused, nothing placed.
	t.Run("a dead job's forced reschedule above the limit is refused", func(t *testing.T) {
		e := e.in(t)
		path := e.spec("vision", "dies", 1, 1, "")
		spec, _ := os.ReadFile(path)
		writeFile(t, path, strings.NewReplacer(`"/bin/sleep"`, `"/bin/false"`, `["3600"]`, `[]`,
			"attempts  = 0", "attempts  = 1\n      interval = \"24h\"\n      delay = \"5s\"\n      delay_function = \"constant\"",
			"reschedule {", "restart {\n      attempts = 0\n      mode = \"fail\"\n    }\n    reschedule {").Replace(string(spec)))
		if out, err := e.cli(ana.SecretID, e.broker.Addr, "job", "run", "-detach", path); err != nil || !strings.Contains(out, "admitted") {
			t.Fatalf("a failing job of 1 GPU: %v\n%s", err, out)
		}
		testcluster.WaitFor(t, 60*time.Second, "the failing job dead", func() error {
			if status := *e.job("vision", "dies").Status; status != "dead" {
				return errors.New(status)
			}
			return nil
		})
		used(1) // direct's
		if out, err := e.cli(ana.SecretID, e.broker.Addr, "job", "run", "-detach", e.spec("vision", "fill", 1, 1, "")); err != nil || !strings.Contains(out, "admitted") {
			t.Fatalf("a second GPU, limit 2: %v\n%s", err, out)
		}
		out, err := e.cli(ana.SecretID, e.broker.Addr, "job", "eval", "-force-reschedule", "-detach", "-namespace", "vision", "dies")
		if err == nil || !strings.Contains(out, `evaluate of "dies" refused: tenant "vision" would hold 3 of its limit of 2 GPUs`) {
			t.Errorf("a forced reschedule of the dead job at the limit: %v\n%s", err, out)
		}
		time.Sleep(2 * time.Second) // an evaluation let through places within this
		if allocs, _, err := n.API.Jobs().Allocations("dies", true, &api.QueryOptions{Namespace: "vision"}); err != nil || len(allocs) != 2 {
			t.Errorf("the dead job has %d allocations, want its 2 failed ones (%v)", len(allocs), err)
		}
		if out, err := e.cli(ana.SecretID, e.broker.Addr, "job", "stop", "-purge", "-namespace", "vision", "fill"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		used(1)
	})
	t.Run("a write the broker does not know is refused, naming its route", func(t *testing.T) {
		e := e.in(t)
		for _, c := range []struct{ method, path, route string }{
			{http.MethodPut, "/v1/made-up-route", "/"},
			{http.MethodDelete, "/v1/job/direct/plan", "/v1/job/<id>/plan"},
			{http.MethodPost, "/v1/nodes", "/v1/nodes"},
		} {
			status, out := e.brokerAPI(ana.SecretID, c.method, c.path)
			if status != http.StatusForbidden || !strings.Contains(out, "route "+c.route+" refused: the broker does not know this write") {
				t.Errorf("%s %s: %d %s", c.method, c.path, status, out)
			}
		}
		// D5: HEAD and OPTIONS write nothing; Nomad answers them itself.
		for _, method := range []string{http.MethodHead, http.MethodOptions} {
			if status, out := e.brokerAPI(ana.SecretID, method, "/v1/jobs?namespace=vision"); status == http.StatusForbidden {
				t.Errorf("%s /v1/jobs refused as an unknown write: %s", method, out)
			}
		}
	})
	t.Run("reads go to Nomad with the caller's own token", func(t *testing.T) {
		e := e.in(t)
		if out, err := e.cli(bob.SecretID, e.broker.Addr, "job", "status", "-namespace", "vision", "direct"); err != nil || !strings.Contains(out, "running") {
			t.Errorf("bob cannot read vision's job through the broker: %v\n%s", err, out)
		}
		if out, err := e.cli("", e.broker.Addr, "job", "status", "-namespace", "vision", "direct"); err == nil {
			t.Errorf("an anonymous caller read vision's job through the broker:\n%s", out)
		}
	})
	t.Run("a user outside submitters is refused by the broker", func(t *testing.T) {
		e := e.in(t)
		for _, args := range [][]string{
			{"job", "run", e.spec("vision", "bobs", 1, 1, "")},
			{"job", "run", e.spec("vision", "bobs-cpu", 1, 0, "")},
			{"job", "stop", "-namespace", "vision", "direct"},
			{"job", "scale", "-namespace", "vision", "direct", "g", "2"},
			{"job", "eval", "-namespace", "vision", "direct"},
		} {
			out, err := e.cli(bob.SecretID, e.broker.Addr, args...)
			if err == nil || !strings.Contains(out, "submitters (role:vision-ml), and your token holds none of them") {
				t.Errorf("bob: nomad %s: %v\n%s", strings.Join(args[:2], " "), err, out)
			}
		}
		if out, err := e.cli("", e.broker.Addr, "job", "run", e.spec("vision", "anon", 1, 1, "")); err == nil || !strings.Contains(out, "send a Nomad ACL token") {
			t.Errorf("anonymous: %v\n%s", err, out)
		}
		for _, id := range []string{"bobs", "bobs-cpu", "anon"} {
			if _, _, err := n.API.Jobs().Info(id, &api.QueryOptions{Namespace: "vision"}); err == nil {
				t.Errorf("Nomad has job %s", id)
			}
		}
		if job := e.job("vision", "direct"); job.Stop != nil && *job.Stop {
			t.Errorf("bob stopped ana's job")
		}
	})

	var queued string
	t.Run("the queue: a submitter's job waits, the API needs a token and shows only what it may read", func(t *testing.T) {
		e := e.in(t)
		out, err := e.cli(cai.SecretID, e.broker.Addr, "job", "run", "-detach", e.spec("vision", "waits", 1, 2, ""))
		if err != nil || !strings.Contains(out, "nomad-gpu: queued as ") {
			t.Fatalf("%v\n%s", err, out)
		}
		queued = strings.TrimSuffix(strings.Fields(out[strings.Index(out, "queued as ")+len("queued as "):])[0], ",")
		if status, body := e.brokerAPI("", http.MethodGet, "/v1/gpu/queue"); status != http.StatusForbidden {
			t.Errorf("queue without a token: %d %s", status, body)
		}
		status, body := e.brokerAPI(bob.SecretID, http.MethodGet, "/v1/gpu/queue")
		if status != http.StatusOK || !strings.Contains(body, "waits") || strings.Contains(body, `"request"`) {
			t.Errorf("bob's queue list: %d %s", status, body)
		}
		if status, body := e.brokerAPI(bob.SecretID, http.MethodDelete, "/v1/gpu/queue/"+queued); status != http.StatusForbidden {
			t.Errorf("bob cancelled cai's queued job: %d %s", status, body)
		}
	})
	t.Run("a submitter's nomad job stop through the broker works", func(t *testing.T) {
		e := e.in(t)
		// Its GPU frees the queued job's way: first take its submitter's token away.
		if _, err := n.API.ACLTokens().Delete(cai.AccessorID, nil); err != nil {
			t.Fatal(err)
		}
		out, err := e.cli(ana.SecretID, e.broker.Addr, "job", "stop", "-namespace", "vision", "direct")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if job := e.job("vision", "direct"); job.Stop == nil || !*job.Stop {
			t.Errorf("job not stopped")
		}
	})
	t.Run("the leader admits a queued job only while its submitter's token exists", func(t *testing.T) {
		e := e.in(t)
		cmd := exec.Command(testcluster.BrokerBinary(t), "queue", "show", queued, "-address", e.broker.Addr,
			"-token", bob.SecretID, "-ca-cert", certs.CAFile)
		testcluster.WaitFor(t, 60*time.Second, "the queued job parked", func() error {
			out, err := exec.Command(cmd.Path, cmd.Args[1:]...).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "no longer exists") {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		})
		if _, _, err := n.API.Jobs().Info("waits", &api.QueryOptions{Namespace: "vision"}); err == nil {
			t.Errorf("the job of a deleted token was registered")
		}
	})
	t.Run("gpu-broker audit names who did what, in order, and never a secret", func(t *testing.T) {
		e := e.in(t)
		out, err := exec.Command(testcluster.BrokerBinary(t), "audit", "-json", "-since", "1h", "-address", e.broker.Addr,
			"-token", brokerToken.SecretID, "-ca-cert", certs.CAFile).CombinedOutput()
		var events []audit.Event
		if err != nil || json.Unmarshal(out, &events) != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		var seen []string
		for i, ev := range events {
			if i > 0 && ev.Time.Before(events[i-1].Time) {
				t.Errorf("out of order: %+v after %+v", ev, events[i-1])
			}
			seen = append(seen, ev.What+" "+ev.Job+" by "+strings.Fields(ev.Who + " ?")[0]+" -> "+strings.SplitN(ev.Result, ":", 2)[0])
		}
		all := strings.Join(seen, "\n")
		for _, want := range []string{"admission direct by ana -> admit", "admission waits by cai -> queue"} {
			if !strings.Contains(all, want) {
				t.Errorf("no %q in the audit trail:\n%s", want, all)
			}
		}
		for _, tok := range []*api.ACLToken{ana, cai, bob, brokerToken} {
			if strings.Contains(string(out), tok.SecretID) {
				t.Errorf("token %s's secret is in the audit trail", tok.Name)
			}
		}
		text, err := exec.Command(testcluster.BrokerBinary(t), "audit", "-job", "direct", "-address", e.broker.Addr,
			"-token", ana.SecretID, "-ca-cert", certs.CAFile).CombinedOutput()
		if err != nil || !strings.Contains(string(text), "WHO") || strings.Contains(string(text), "waits") {
			t.Errorf("audit -job direct:\n%s", text)
		}
	})
	// Last: it revokes the broker's own token.
	t.Run("the broker's token revoked: the queue waits, health says why; a new token in its file and SIGHUP resume it", func(t *testing.T) {
		e := e.in(t)
		out, err := e.cli(ana.SecretID, e.broker.Addr, "job", "run", e.spec("vision", "full", 1, 2, ""))
		if err != nil || !strings.Contains(out, "nomad-gpu: admitted") {
			t.Fatalf("%v\n%s", err, out)
		}
		out, err = e.cli(ana.SecretID, e.broker.Addr, "job", "run", "-detach", e.spec("vision", "later", 1, 1, ""))
		if err != nil || !strings.Contains(out, "nomad-gpu: queued as ") {
			t.Fatalf("%v\n%s", err, out)
		}
		later := strings.TrimSuffix(strings.Fields(out[strings.Index(out, "queued as ")+len("queued as "):])[0], ",")
		if _, err := n.API.ACLTokens().Delete(brokerToken.AccessorID, nil); err != nil {
			t.Fatal(err)
		}
		// Room for it: were the token valid, the leader would register it now.
		if _, _, err := n.API.Jobs().Deregister("full", true, &api.WriteOptions{Namespace: "vision"}); err != nil {
			t.Fatal(err)
		}
		testcluster.WaitFor(t, 60*time.Second, "the broker to say Nomad refuses its token", func() error {
			if status, body := e.brokerAPI("", http.MethodGet, "/v1/gpu/health"); status != http.StatusServiceUnavailable ||
				!strings.Contains(body, "Nomad refuses the broker's own token") || !strings.Contains(body, "nomad.token_file") {
				return fmt.Errorf("health: %d %s", status, body)
			}
			if v := e.broker.Scrape()["nomadgpu_nomad_token_refused"]; v != 1 {
				return fmt.Errorf("nomadgpu_nomad_token_refused %v", v)
			}
			return nil
		})
		show := func() string {
			out, _ := exec.Command(testcluster.BrokerBinary(t), "queue", "show", later, "-address", e.broker.Addr,
				"-token", ana.SecretID, "-ca-cert", certs.CAFile).CombinedOutput()
			return string(out)
		}
		if out := show(); strings.Contains(out, "parked") || !strings.Contains(out, "later") {
			t.Errorf("with the broker's token refused the queued job is not waiting:\n%s", out)
		}
		renewed := token("gpu-broker-2", "management", nil, nil)
		e.broker.ReplaceToken(renewed.SecretID)
		e.waitRunning("vision", "later")
		if status, body := e.brokerAPI("", http.MethodGet, "/v1/gpu/health"); status != http.StatusOK {
			t.Errorf("health with the new token: %d %s", status, body)
		}
		if v := e.broker.Scrape()["nomadgpu_nomad_token_refused"]; v != 0 {
			t.Errorf("nomadgpu_nomad_token_refused %v with the new token", v)
		}
		if job := e.job("vision", "later"); job.Meta["nomad-gpu.tenant"] != "vision" {
			t.Errorf("registered without the broker's stamp: %v", job.Meta)
		}
	})
}

// writeRules are docs/broker.md's passthrough user policy for namespace ns.
func writeRules(ns string) string {
	return fmt.Sprintf("namespace %q {\n  policy = \"write\"\n}\nnode {\n  policy = \"read\"\n}\n", ns)
}

// TestPassthroughWithNomadACLs walks issue 6 §3 with ACLs on and users
// holding write rights: two tenants' users and the broker's own token.
func TestPassthroughWithNomadACLs(t *testing.T) {
	t.Parallel()
	n, consul, token := startACLCluster(t, map[string]string{"vision-write": writeRules("vision"), "search-write": writeRules("search")})
	vic := token("vic", "client", nil, []string{"vision-write"})
	sue := token("sue", "client", nil, []string{"search-write"})
	brokerToken := token("gpu-broker", "management", nil, nil)
	policyDir := t.TempDir()
	writeFile(t, filepath.Join(policyDir, "policy.hcl"), twoTenantPolicy)
	e := &aclEnv{env: &env{t: t, nomad: n, dir: t.TempDir(), policyDir: policyDir}}
	e.broker = testcluster.StartBrokerWith(t, n, consul, policyDir, testcluster.BrokerOptions{Token: brokerToken.SecretID})
	waitForView(t, 4, func() string {
		out, _ := e.cli(vic.SecretID, e.broker.Addr, "job", "plan", e.spec("vision", "probe", 1, 5, ""))
		return out
	})
	inNomad := func(id string) bool {
		_, _, err := n.API.Jobs().Info(id, &api.QueryOptions{Namespace: "vision"})
		return err == nil
	}

	// Nomad acts on a token sent in the body alone (SecretID of a register,
	// AuthToken of the other job calls) when no header carries one: the
	// broker names that caller too (D6: audited as anonymous).
	t.Run("a token in the body alone: the broker names the caller Nomad acts for", func(t *testing.T) {
		e := e.in(t)
		jb := job("search", "body-token", api.JobTypeBatch).group("g", ptr(1), nil, task(dev("nvidia/gpu", 1)))
		if status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/jobs", jb.body(map[string]any{"SecretID": sue.SecretID}, canonical)); status != http.StatusOK {
			t.Fatalf("register with sue's token in the body: %d %s", status, out)
		}
		out, err := exec.Command(testcluster.BrokerBinary(t), "audit", "-json", "-job", "body-token", "-address", e.broker.Addr, "-token", brokerToken.SecretID).CombinedOutput()
		var events []audit.Event
		if err != nil || json.Unmarshal(out, &events) != nil {
			t.Fatalf("audit: %v\n%s", err, out)
		}
		for _, ev := range events {
			if ev.What == audit.Admission && !strings.HasPrefix(ev.Who, "sue") {
				t.Errorf("the admission of body-token is by %q, want sue's token", ev.Who)
			}
		}
		if len(events) == 0 {
			t.Errorf("no audit event for body-token")
		}
		if _, _, err := n.API.Jobs().Deregister("body-token", true, &api.WriteOptions{Namespace: "search"}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("another tenant's user: Nomad refuses what the broker admits, the broker what it would queue", func(t *testing.T) {
		e := e.in(t)
		out, err := e.cli(sue.SecretID, e.broker.Addr, "job", "run", e.spec("vision", "sues", 1, 1, ""))
		if err == nil || !strings.Contains(out, "Permission denied") || inNomad("sues") {
			t.Errorf("admitted with sue's token: %v\n%s", err, out)
		}
		if out, err := e.cli(vic.SecretID, e.broker.Addr, "job", "run", e.spec("vision", "full", 1, 2, "")); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		out, err = e.cli(sue.SecretID, e.broker.Addr, "job", "run", "-detach", e.spec("vision", "sues", 1, 1, ""))
		if err == nil || !strings.Contains(out, "not queued: Nomad refused to plan it with your token") {
			t.Errorf("queued for sue: %v\n%s", err, out)
		}
		for _, tok := range []string{"", "00000000-0000-0000-0000-000000000000"} {
			if out, err := e.cli(tok, e.broker.Addr, "job", "run", "-detach", e.spec("vision", "anon", 1, 1, "")); err == nil || strings.Contains(out, "queued as") {
				t.Errorf("token %q: %v\n%s", tok, err, out)
			}
		}
	})
	var queued string
	t.Run("the queue API shows each user what its token may read", func(t *testing.T) {
		e := e.in(t)
		out, err := e.cli(vic.SecretID, e.broker.Addr, "job", "run", "-detach", e.spec("vision", "waits", 1, 1, ""))
		if err != nil || !strings.Contains(out, "queued as ") {
			t.Fatalf("%v\n%s", err, out)
		}
		queued = strings.TrimSuffix(strings.Fields(out[strings.Index(out, "queued as ")+len("queued as "):])[0], ",")
		if status, body := e.brokerAPI(vic.SecretID, http.MethodGet, "/v1/gpu/queue/"+queued); status != http.StatusOK || !strings.Contains(body, `"request"`) {
			t.Errorf("vic's own entry: %d %s", status, body)
		}
		if status, body := e.brokerAPI(sue.SecretID, http.MethodGet, "/v1/gpu/queue"); status != http.StatusOK || strings.Contains(body, "waits") {
			t.Errorf("sue's list: %d %s", status, body)
		}
		for _, path := range []string{"/v1/gpu/queue/" + queued, "/v1/gpu/usage"} {
			if status, _ := e.brokerAPI("", http.MethodGet, path); status != http.StatusForbidden {
				t.Errorf("anonymous %s: %d", path, status)
			}
		}
		if status, _ := e.brokerAPI(sue.SecretID, http.MethodDelete, "/v1/gpu/queue/"+queued); status == http.StatusOK {
			t.Errorf("sue cancelled vic's entry")
		}
	})
	t.Run("the leader admits a queued job only while its submitter's rights are the ones Nomad checked", func(t *testing.T) {
		e := e.in(t)
		// The policy changes (here: only its description): what Nomad checked no longer holds.
		if _, err := n.API.ACLPolicies().Upsert(&api.ACLPolicy{Name: "vision-write", Description: "changed", Rules: writeRules("vision")}, nil); err != nil {
			t.Fatal(err)
		}
		if out, err := e.cli(vic.SecretID, e.broker.Addr, "job", "stop", "-namespace", "vision", "full"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		testcluster.WaitFor(t, 60*time.Second, "the queued job parked", func() error {
			status, body := e.brokerAPI(vic.SecretID, http.MethodGet, "/v1/gpu/queue/"+queued)
			if !strings.Contains(body, "changed since it was queued") {
				return fmt.Errorf("%d %s", status, body)
			}
			return nil
		})
		if inNomad("waits") {
			t.Errorf("registered although the submitter's rights changed")
		}
		out, err := e.cli(vic.SecretID, e.broker.Addr, "job", "run", e.spec("vision", "again", 1, 1, ""))
		if err != nil || !strings.Contains(out, "nomad-gpu: admitted") {
			t.Errorf("submitted again: %v\n%s", err, out)
		}
	})
}
