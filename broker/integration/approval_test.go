package integration

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/gpuapi"
	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
)

// TestAnApprovalLetsAJobAboveTheLimitUntilItExpires, with Nomad's ACLs on:
//   - a job beyond its tenant's limit waits;
//   - its user asks for 2 GPUs above the limit;
//   - neither the user nor an approver granting their own request may grant
//     it, with any of their tokens;
//   - a request beyond the tenant's bounds is refused;
//   - an approver grants it, and the job runs;
//   - when the approval expires, with nobody acting, the job goes back to
//     the queue.
func TestAnApprovalLetsAJobAboveTheLimitUntilItExpires(t *testing.T) {
	t.Parallel()
	n, consul, token := startACLCluster(t, map[string]string{"vision-write": writeRules("vision"), "default-read": `namespace "default" { policy = "read" }`})
	ana := token("ana", "client", nil, []string{"vision-write"})
	ops := token("ops-oncall", "client", nil, []string{"vision-write"})
	opsLaptop := token("ops-oncall", "client", nil, []string{"vision-write"})          // the same person's second token
	opsCI := token("ops-oncall-ci", "client", nil, []string{"vision-write"})           // a token made for the same person
	robot := token("robot", "client", nil, []string{"vision-write"})                   // another name, the same rights
	backup := token("backup", "client", nil, []string{"vision-write", "default-read"}) // and one more (N5)
	brokerToken := token("gpu-broker", "management", nil, nil)
	policyDir := t.TempDir()
	writeFile(t, filepath.Join(policyDir, "policy.hcl"), `
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
  approvals {
    max_extra_gpus = 4
    max_duration   = "2h"
  }
}
borrowing {
  enabled = true
}
approvers = ["ops-oncall", "ops-oncall-ci", "robot", "backup"]
reclaim_settings {
  period = "1s"
}
`)
	e := &aclEnv{env: &env{t: t, nomad: n, dir: t.TempDir(), policyDir: policyDir}}
	e.broker = testcluster.StartBrokerWith(t, n, consul, policyDir, testcluster.BrokerOptions{Token: brokerToken.SecretID})
	waitForView(t, 4, func() string {
		out, _ := e.cli(ana.SecretID, e.broker.Addr, "job", "plan", e.spec("vision", "probe", 1, 5, ""))
		return out
	})
	broker := func(tok string, args ...string) (string, error) {
		out, err := exec.Command(testcluster.BrokerBinary(t), append(args, "-address", e.broker.Addr, "-token", tok)...).CombinedOutput()
		return string(out), err
	}
	show := func(id string) approval.Approval {
		out, err := broker(ana.SecretID, "approval", "show", id, "-json")
		var a approval.Approval
		if err != nil || json.Unmarshal([]byte(out), &a) != nil {
			t.Fatalf("approval show %s: %v\n%s", id, err, out)
		}
		return a
	}

	if out, err := e.cli(ana.SecretID, e.broker.Addr, "job", "run", "-detach", e.spec("vision", "base", 1, 2, "")); err != nil || !strings.Contains(out, "admitted") {
		t.Fatalf("%v\n%s", err, out)
	}
	e.waitRunning("vision", "base")
	if out, err := e.cli(ana.SecretID, e.broker.Addr, "job", "run", "-detach", e.spec("vision", "big", 1, 2, "")); err != nil ||
		!strings.Contains(out, "would hold 4 of its limit of 2") {
		t.Fatalf("big beyond the limit must wait: %v\n%s", err, out)
	}
	out, err := broker(ana.SecretID, "approval", "request", "-job", "big", "-namespace", "vision", "-reason", "paper deadline",
		"-extra-gpus", "2", "-for", "15s", "-json")
	var asked approval.Approval
	if err != nil || json.Unmarshal([]byte(out), &asked) != nil || asked.State != approval.Pending {
		t.Fatalf("request: %v\n%s", err, out)
	}
	if out, err := broker(ana.SecretID, "approval", "grant", asked.ID); err == nil || !strings.Contains(out, "ana is not one of the policy's approvers") {
		t.Errorf("the user granted: %v\n%s", err, out)
	}
	out, err = broker(ops.SecretID, "approval", "request", "-job", "base", "-namespace", "vision", "-reason", "mine", "-priority", "90", "-for", "1h", "-json")
	var own approval.Approval
	if err != nil || json.Unmarshal([]byte(out), &own) != nil {
		t.Fatalf("request: %v\n%s", err, out)
	}
	for _, tok := range []string{ops.SecretID, opsLaptop.SecretID, opsCI.SecretID, robot.SecretID, backup.SecretID} {
		if out, err := broker(tok, "approval", "grant", own.ID); err == nil || !strings.Contains(out, "nobody grants or denies their own request") {
			t.Errorf("an approver granted their own request: %v\n%s", err, out)
		}
	}
	for _, ask := range [][]string{{"-extra-gpus", "5", "-for", "1h"}, {"-extra-gpus", "1", "-for", "3h"}} {
		out, err := broker(ana.SecretID, append([]string{"approval", "request", "-job", "big", "-namespace", "vision", "-reason", "more"}, ask...)...)
		if err == nil || !strings.Contains(out, `tenant "vision"'s approvals`) {
			t.Errorf("a request beyond approvals { max_extra_gpus = 4, max_duration = 2h }: %v\n%s", err, out)
		}
	}
	if out, err := broker(ops.SecretID, "approval", "grant", asked.ID); err != nil || !strings.Contains(out, "granted") {
		t.Fatalf("grant: %v\n%s", err, out)
	}
	granted := show(asked.ID)
	e.waitRunning("vision", "big")
	// max_extra_gpus bounds what the approvals in force grant the tenant's
	// jobs together (N4: three grants of +2 gave one job +6 with a bound
	// of 2): big's +2 and another job's +2 make 4, one more is refused.
	// (Not big's own: a grant beside its first would keep it running past
	// the first one's expiry.)
	for i, want := range []string{"granted", "at most 4 (approvals { max_extra_gpus })"} {
		out, err := broker(ana.SecretID, "approval", "request", "-job", "other", "-namespace", "vision", "-reason", "more",
			"-extra-gpus", "2", "-for", "15s", "-json")
		var more approval.Approval
		if err != nil || json.Unmarshal([]byte(out), &more) != nil {
			t.Fatalf("request %d: %v\n%s", i+2, err, out)
		}
		if out, _ := broker(ops.SecretID, "approval", "grant", more.ID); !strings.Contains(out, want) {
			t.Errorf("grant of a +2 request for other beside %d GPUs granted already (max 4): want %q\n%s", 2*(i+1), want, out)
		}
	}

	// Requests are bounded (D4: 600 requests of 48 KiB were all kept): a
	// reason of at most 1 KiB, and at most 10 waiting for a decision a person.
	if out, err := broker(ana.SecretID, "approval", "request", "-job", "other", "-namespace", "vision", "-reason", strings.Repeat("x", 2000),
		"-extra-gpus", "1", "-for", "1h"); err == nil || !strings.Contains(out, "more than 1024") {
		t.Errorf("a 2000-byte reason: %v\n%s", err, out)
	}
	refused := ""
	for i := 0; i < approval.MaxPendingPerRequester+1 && refused == ""; i++ {
		if out, err := broker(ana.SecretID, "approval", "request", "-job", "other", "-namespace", "vision", "-reason", "again",
			"-extra-gpus", "1", "-for", "1h"); err != nil {
			refused = out
		}
	}
	if !strings.Contains(refused, "requests waiting for a decision already") {
		t.Errorf("ana's requests beyond 10 pending: %q", refused)
	}

	// Nobody acts from here on.
	testcluster.WaitFor(t, 60*time.Second, "big back in the queue after the approval expired", func() error {
		var entries []gpuapi.QueuedJob
		out, err := broker(ana.SecretID, "queue", "list", "-json")
		if err != nil || json.Unmarshal([]byte(out), &entries) != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		for _, q := range entries {
			if q.JobID == "big" {
				return nil
			}
		}
		return fmt.Errorf("queue %+v", entries)
	})
	if a := show(asked.ID); a.State != approval.Expired || time.Since(granted.ExpiresAt) < 0 {
		t.Errorf("approval after its time: %+v", a)
	}
	if job, _, err := n.API.Jobs().Info("big", &api.QueryOptions{Namespace: "vision"}); err != nil || job.Stop == nil || !*job.Stop {
		t.Errorf("big still running in Nomad after its approval expired (%v)", err)
	}
	out, err = broker(brokerToken.SecretID, "audit", "-json", "-job", "big")
	var events []audit.Event
	if err != nil || json.Unmarshal([]byte(out), &events) != nil {
		t.Fatalf("audit: %v\n%s", err, out)
	}
	var seen []string
	for _, ev := range events {
		seen = append(seen, ev.What+" by "+strings.Fields(ev.Who + " ?")[0])
	}
	all := strings.Join(seen, ", ")
	for _, want := range []string{"approval-request by ana", "approval-grant by ops-oncall", "queue-admission by ana", "approval-expire by broker",
		"reclaim-action by broker"} {
		if !strings.Contains(all, want) {
			t.Errorf("no %q in the audit trail: %s", want, all)
		}
	}
}
