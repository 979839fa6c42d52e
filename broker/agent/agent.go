// Package agent is the broker daemon: from its configuration it builds every
// client, store, loop and watcher, serves the proxy and the broker's API, and
// while it leads runs the queue, reclaim and preemption loops, until its
// context ends. cmd/gpu-broker only parses flags, loads the config and runs it.
package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	nomad "github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/admitter"
	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/config"
	"github.com/nomad-gpu/nomad-gpu/broker/consulkv"
	"github.com/nomad-gpu/nomad-gpu/broker/decide"
	"github.com/nomad-gpu/nomad-gpu/broker/leader"
	brokermetrics "github.com/nomad-gpu/nomad-gpu/broker/metrics"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadapi"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policyhcl"
	"github.com/nomad-gpu/nomad-gpu/broker/policystore"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaimer"
	"github.com/nomad-gpu/nomad-gpu/broker/server"
	gpuusage "github.com/nomad-gpu/nomad-gpu/broker/usage"
)

// Agent is one broker.
type Agent struct {
	cfg    *config.Config
	log    hclog.Logger
	reload <-chan os.Signal // the policy and the Nomad token file are read again at once (SIGHUP)
}

// New is a broker for a validated configuration; reload (may be nil) asks
// it to read its policy again at once.
func New(cfg *config.Config, log hclog.Logger, reload <-chan os.Signal) *Agent {
	return &Agent{cfg: cfg, log: log, reload: reload}
}

// Run serves until ctx ends, then shuts the listener down gracefully. It
// leads whenever it holds the Consul lock; a broker that stops leading (or
// whose context ends) stops its leader's loops.
func (a *Agent) Run(ctx context.Context) error {
	cfg, log := a.cfg, a.log
	var tlsCfg *nomad.TLSConfig
	if t := cfg.Nomad.TLS; t != nil {
		tlsCfg = &nomad.TLSConfig{CACert: t.CAFile, ClientCert: t.CertFile, ClientKey: t.KeyFile}
	}
	nomadClient, err := nomadapi.New(cfg.Nomad.Address, cfg.Nomad.Token, tlsCfg)
	if err != nil {
		return err
	}
	metrics := brokermetrics.New()
	consulCfg := consul.DefaultConfig()
	consulCfg.Address, consulCfg.Token = cfg.Consul.Address, cfg.Consul.Token
	if t := cfg.Consul.TLS; t != nil {
		consulCfg.TLSConfig = consul.TLSConfig{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile}
	}
	consulClient, err := consul.NewClient(consulCfg)
	if err != nil {
		return fmt.Errorf("consul client: %w", err)
	}
	// The client keeps this *http.Client (TLS set up): count its failures.
	consulCfg.HttpClient.Transport = metrics.CountingTransport(consulCfg.HttpClient.Transport)

	key, err := consulkv.StampKey(ctx, consulClient.KV(), cfg.Consul.KVPrefix)
	if err != nil {
		return err
	}
	stamper := nomadjob.Stamper{Key: key}
	view := cluster.NewView(stamper.VerifyCounting)
	budgets := &gpuusage.BudgetBook{}
	view.SetBudgets(budgets.OverBudget)
	policies, diags := policystore.New(cfg.PolicyDir, view.Capacity, log.Named("policy"))
	if policies == nil {
		return fmt.Errorf("policy %s is invalid:\n%s", cfg.PolicyDir, policyhcl.FormatDiagnostics(diags))
	}
	policies.AllowNoTenants = cfg.AllowPolicyWithoutTenants

	agentRegion, acls, err := nomadClient.Agent(ctx)
	if err != nil {
		return err
	}
	exclusive := cfg.Enforcement == config.Exclusive
	if exclusive && !acls {
		return errors.New(`enforcement = "exclusive" needs Nomad's ACLs on: without them Nomad cannot refuse the writes that do not come through the broker`)
	}
	peers, err := peerClient(cfg.TLS)
	if err != nil {
		return err
	}
	region := cfg.Nomad.Region
	if region == "" {
		region = agentRegion
	}
	kvLog := log.Named("consul")
	aside := consulkv.NewAside(consulClient, cfg.Consul.KVPrefix, func(u consulkv.Unreadable) {
		metrics.KVUnreadable(u.Kind)
		kvLog.Error("a record that cannot be read was set aside; the others are read on", "kind", u.Kind, "key", u.Key,
			"moved_to", u.MovedTo, "error", u.Err)
	})
	store := consulkv.NewQueue(consulClient.KV(), cfg.Consul.KVPrefix, aside)
	decisions := consulkv.NewDecisions(consulClient.KV(), cfg.Consul.KVPrefix, aside)
	scales := consulkv.NewScales(consulClient.KV(), cfg.Consul.KVPrefix, aside)
	approvals := consulkv.NewApprovals(consulClient.KV(), cfg.Consul.KVPrefix, aside)
	go approvals.Follow(ctx)
	backoffs := consulkv.NewBackoffs(consulClient.KV(), cfg.Consul.KVPrefix, aside)
	go backoffs.Follow(ctx)
	go store.Follow(ctx) // the queue's index: the leader skips passes while nothing changed
	profiles, storedProfiles := gpuusage.NewProfiles(), consulkv.NewProfiles(consulClient, cfg.Consul.KVPrefix, aside)
	rollups := consulkv.NewRollups(consulClient, cfg.Consul.KVPrefix, aside)
	forecast := &queue.Forecast{}
	elector := &leader.Elector{Client: consulClient, Key: cfg.Consul.KVPrefix + "leader", Address: cfg.Advertise,
		Log: log.Named("leader")}
	metrics.Observe(brokermetrics.Sources{Cluster: view, Policies: policies, Queue: store, Leader: elector,
		PolicyState: func() (time.Time, bool) { st := policies.Status(); return st.LoadedAt, st.Stale }, TokenRefused: nomadClient.TokenRefused,
		InBackoff: func() map[string]int {
			p, now, out := policies.Current(), time.Now(), map[string]int{}
			for _, b := range backoffs.All() {
				if t := p.TenantOf(b.Namespace); t != nil && admission.BackoffFor(p.Borrowing, b.Count, b.Last, now) != nil {
					out[t.Name]++
				}
			}
			return out
		}})
	view.SetAllocEvents(metrics.AllocEvent)
	var trail *audit.Log
	if a := cfg.Audit; a != nil {
		if trail, err = audit.Open(a.Path, a.MaxBytes, a.MaxFiles, cfg.Advertise); err != nil {
			return err
		}
		defer trail.Close()
		trail.Failed = func(err error) {
			metrics.AuditFailure()
			log.Error("audit trail cannot be written", "error", err)
		}
		policies.Reloads = func(took bool, detail string) {
			trail.Write(audit.Event{Who: audit.BrokerAct, What: audit.PolicyReload, Result: detail})
		}
	}
	view.SetReverts((&leader.Reverts{Leader: elector, Policies: policies, Usage: view.Usage, Audit: trail, Metrics: metrics,
		Log: log.Named("revert")}).Observed)
	resync := time.NewTicker(cfg.ResyncInterval)
	defer resync.Stop()
	go view.Follow(ctx, nomadClient, log.Named("cluster"), resync.C)
	policyReload := make(chan os.Signal, 1)
	go a.reloads(ctx, nomadClient, policyReload)
	go policies.Watch(ctx, policyReload, cfg.PolicyPollInterval)
	// 32 registrations in flight stays well inside Nomad's default limit of 100
	// HTTP connections per client.
	adm := &admitter.Admitter{Log: log.Named("queue"), Queue: store, Nomad: nomadClient, Cluster: view,
		Policies: policies, Stamper: stamper, Now: time.Now, GPUsCameBack: view.GPUsCameBack, Blocked: nomadClient, Exclusive: exclusive, Metrics: metrics, FairShare: rollups, Audit: trail, Approvals: approvals,
		Preemptions: backoffs.Preemptions, Parallel: 32}
	srv, err := server.New(server.Options{Leader: elector, Log: log.Named("proxy"), Nomad: cfg.Nomad.Address,
		Client: nomadClient.HTTPClient(), Policies: policies, Cluster: view, Queue: store, Decisions: decisions, Scales: scales, Profiles: profiles, RightSizing: storedProfiles, Metrics: metrics, Rollups: rollups, FairShare: rollups, Audit: trail, Approvals: approvals, Preemptions: backoffs.Preemptions, SetAside: aside, PolicyStatus: policies.Status, Unhealthy: func() string {
			if nomadClient.TokenRefused() {
				return "Nomad refuses the broker's own token: nothing is admitted from the queue until it is valid again " +
					"(write a valid one to nomad.token_file and send the broker SIGHUP, or set nomad.token and restart it)"
			}
			return ""
		}, Forecast: forecast, Stamper: stamper, Region: region, ACLs: acls, BodyReadTimeout: cfg.BodyReadTimeoutDuration,
		Exclusive: exclusive, Token: nomadClient.Token, Peers: peers})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	httpServer := &http.Server{Handler: debugHandler(cfg.EnableDebug, srv.Handler()), ReadHeaderTimeout: 10 * time.Second}
	if cfg.TLS != nil {
		go httpServer.ServeTLS(ln, cfg.TLS.CertFile, cfg.TLS.KeyFile)
	} else {
		go httpServer.Serve(ln)
	}
	log.Info("broker listening", "address", cfg.Listen, "tls", cfg.TLS != nil, "enforcement", cfg.Enforcement, "nomad", cfg.Nomad.Address, "consul", cfg.Consul.Address,
		"policy_dir", cfg.PolicyDir, "region", region, "acls", acls)

	elector.Run(ctx, func(ctx context.Context) {
		reassert := time.NewTicker(cfg.PreemptionReassertInterval)
		defer reassert.Stop()
		go leader.KeepPreemption(ctx, reassert.C, policies.Reloaded(), func() (bool, bool) {
			p := policies.Current()
			return p.Preemption.Batch, p.Preemption.Service
		}, nomadClient, log.Named("preemption"))
		// Each term starts afresh: what earlier leaders recorded is read back.
		observer := &nomadapi.Observer{Client: nomadClient, View: view, Verify: decide.Verifier(stamper, scales), Samples: view.SetSamples}
		rec := &reclaimer.Reclaimer{Log: log.Named("reclaim"), Records: decisions, Observer: observer, Actor: nomadClient, Policies: policies, Now: time.Now, NewID: queue.NewID,
			Requeue: &reclaimer.Requeue{Jobs: nomadClient, Actor: nomadClient, Queue: store, Policies: policies, Preempted: backoffs.Preempted},
			Watchers: []reclaimer.Watcher{&reclaimer.Recorder{Store: storedProfiles, Table: profiles, Policies: policies},
				&reclaimer.Ledger{Store: rollups, Policies: policies, Metrics: metrics, Budgets: budgets, Clock: nomadClient.NomadNow,
					Ended: observer.Ended},
				&reclaimer.Bander{Log: log.Named("band"), Policies: policies, Usage: view, Jobs: nomadClient, Grants: scales,
					Stamper: stamper, Lock: view.LockJob, Audit: trail},
				&reclaimer.Expirer{Store: approvals, Jobs: view, Policies: policies, Records: decisions, NewID: queue.NewID, Audit: trail},
				&reclaimer.Pruner{What: "scale and dispatch grants", Every: grantPruneInterval, Log: log.Named("prune"),
					Prune: func(ctx context.Context) (int, error) { return scales.Prune(ctx, nomadClient.Gone) }},
				// A job left alone for max_backoff after its backoff ended
				// starts again from no preemption.
				&reclaimer.Pruner{What: "preemption counts", Every: grantPruneInterval, Log: log.Named("prune"),
					Prune: func(ctx context.Context) (int, error) {
						b := policies.Current().Borrowing
						return backoffs.Prune(ctx, time.Now(), func(n int) time.Duration { return b.BackoffAfter(n) + b.MaxBackoff })
					}}},
			Metrics: metrics, Audit: trail, Forecast: forecast, Queued: store,
			Granted: func(now time.Time) map[string]float64 {
				p := policies.Current()
				return approval.ExtraByTenant(approvals.Current(), func(ns string) string {
					if t := p.TenantOf(ns); t != nil {
						return t.Name
					}
					return ""
				}, now)
			}}
		go rec.Run(ctx, time.After)
		passes := time.NewTicker(cfg.QueueIntervalDuration)
		defer passes.Stop()
		adm.Run(ctx, view.Changed(), passes.C)
	})

	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return httpServer.Shutdown(shutdown)
}

// reloads reads nomad.token_file again at each SIGHUP (a revoked or rotated
// token is replaced with no restart, and the queue goes on at its next pass),
// then passes the signal on for the policy to be read again.
func (a *Agent) reloads(ctx context.Context, nomadClient *nomadapi.Client, policy chan<- os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case sig := <-a.reload:
			if a.cfg.Nomad.TokenFile != "" {
				switch tok, err := a.cfg.Nomad.ReadToken(); {
				case err != nil:
					a.log.Error("the Nomad token file cannot be read: the token in use is kept", "error", err)
				case tok == nomadClient.Token():
					a.log.Info("the Nomad token file holds the token in use", "path", a.cfg.Nomad.TokenFile)
				default:
					if err := nomadClient.SetToken(tok); err != nil {
						a.log.Error("the Nomad token file's token cannot be used: the token in use is kept", "error", err)
					} else {
						a.log.Info("the Nomad token was replaced from the token file", "path", a.cfg.Nomad.TokenFile)
					}
				}
			}
			select {
			case policy <- sig:
			default: // a reload is already asked for
			}
		}
	}
}

// grantPruneInterval is how often the leader deletes the grants of jobs
// Nomad no longer has (one lookup in Nomad per grant).
const grantPruneInterval = 10 * time.Minute

// debugHandler serves Go's profiler beside the broker when enabled: only
// these paths; everything else reaches the broker's handler as it came (a
// ServeMux would clean paths before the broker reads them).
func debugHandler(enabled bool, broker http.Handler) http.Handler {
	if !enabled {
		return broker
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/debug/pprof/profile":
			pprof.Profile(w, r)
		case strings.HasPrefix(r.URL.Path, "/debug/pprof/"):
			pprof.Index(w, r)
		default:
			broker.ServeHTTP(w, r)
		}
	})
}

// peerClient reaches the other brokers: over TLS, trusting the CA of the
// broker's own tls block, when it serves TLS.
func peerClient(t *config.TLS) (*http.Client, error) {
	if t == nil {
		return &http.Client{}, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("broker tls: read ca_file: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("broker tls: ca_file %s holds no PEM certificate", t.CAFile)
		}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}, nil
}
