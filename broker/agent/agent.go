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
	"log"
	"maps"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"slices"
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
	"github.com/nomad-gpu/nomad-gpu/broker/gpuapi"
	"github.com/nomad-gpu/nomad-gpu/broker/leader"
	brokermetrics "github.com/nomad-gpu/nomad-gpu/broker/metrics"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadapi"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/policyhcl"
	"github.com/nomad-gpu/nomad-gpu/broker/policystore"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaimer"
	"github.com/nomad-gpu/nomad-gpu/broker/server"
	gpuusage "github.com/nomad-gpu/nomad-gpu/broker/usage"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
)

// Agent is one broker. Run builds it in named steps, each from what the
// ones before it built, in the way nomad-autoscaler's agent is set up.
type Agent struct {
	cfg    *config.Config
	log    hclog.Logger
	reload <-chan os.Signal // the policy and the Nomad token file are read again at once (SIGHUP)
	clock  clock.Clock      // what every part it wires reads time by

	// setupClients
	nomad   *nomadapi.Client
	tlsCfg  *nomad.TLSConfig // the nomad block's, for every region's client
	consul  *consul.Client
	metrics *brokermetrics.Metrics
	stamper nomadjob.Stamper
	// setupNomadAgent
	region          string
	acls, exclusive bool
	peers           *http.Client
	// setupPolicy
	view     *cluster.View    // the broker's own region's
	regions  *cluster.Regions // every region it governs, view by view
	others   map[string]region
	budgets  *gpuusage.BudgetBook
	owed     *queue.OwedBook // the last queue pass's, for admissions between passes
	policies *policystore.Store
	// setupStores
	stores stores
	// setupObservers
	elector  *leader.Elector
	trail    *audit.Log // nil: no audit trail
	forecast *queue.Forecast
	// setupServer
	admitter *admitter.Admitter
	server   *server.Server
}

// stores are the broker's records in Consul KV, and the tables it keeps
// beside them.
type stores struct {
	aside          *consulkv.Aside
	queue          *consulkv.Queue
	decisions      *consulkv.Decisions
	scales         *consulkv.Scales
	stops          consulkv.Stops
	writes         consulkv.Registrations
	approvals      *consulkv.Approvals
	backoffs       *consulkv.Backoffs
	holds          *consulkv.Holds
	drains         *consulkv.Drains
	profiles       *gpuusage.Profiles
	storedProfiles *consulkv.Profiles
	rollups        *consulkv.Rollups
}

// New is a broker for a validated configuration; reload (may be nil) asks
// it to read its policy again at once.
func New(cfg *config.Config, log hclog.Logger, reload <-chan os.Signal) *Agent {
	return &Agent{cfg: cfg, log: log, reload: reload, clock: clock.Real}
}

// Run serves until ctx ends, then shuts the listener down gracefully. It
// leads whenever it holds the Consul lock; a broker that stops leading (or
// whose context ends) stops its leader's loops.
func (a *Agent) Run(ctx context.Context) error {
	defer a.close()
	for _, step := range []func(context.Context) error{a.setupClients, a.setupNomadAgent, a.setupPolicy,
		a.setupStores, a.setupObservers, a.setupServer} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	a.follow(ctx)
	httpServer, err := a.serve()
	if err != nil {
		return err
	}
	// Standing by, a broker prepares the queued jobs a pass would, so that
	// its first pass as leader need not read them all.
	warm := time.NewTicker(warmEvery)
	defer warm.Stop()
	go a.admitter.Warm(ctx, warm.C)
	a.elector.Run(ctx, a.lead)
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return httpServer.Shutdown(shutdown)
}

// close releases what the steps opened.
func (a *Agent) close() {
	if a.trail != nil {
		a.trail.Close()
	}
}

// setupClients makes the Nomad and Consul clients and the metrics, and
// reads the key admissions are stamped with (made once, in Consul KV).
func (a *Agent) setupClients(ctx context.Context) error {
	cfg := a.cfg
	if t := cfg.Nomad.TLS; t != nil {
		a.tlsCfg = &nomad.TLSConfig{CACert: t.CAFile, ClientCert: t.CertFile, ClientKey: t.KeyFile}
	}
	var err error
	if a.nomad, err = nomadapi.New(cfg.Nomad.Address, cfg.Nomad.Token, a.tlsCfg); err != nil {
		return err
	}
	a.metrics = brokermetrics.New()
	// Every call to Nomad, the users' passed through too, shares this client.
	nomadHTTP := a.nomad.HTTPClient()
	nomadHTTP.Transport = a.metrics.NomadTransport(nomadHTTP.Transport)
	consulCfg := consul.DefaultConfig()
	consulCfg.Address, consulCfg.Token = cfg.Consul.Address, cfg.Consul.Token
	if t := cfg.Consul.TLS; t != nil {
		consulCfg.TLSConfig = consul.TLSConfig{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile}
	}
	if a.consul, err = consul.NewClient(consulCfg); err != nil {
		return fmt.Errorf("consul client: %w", err)
	}
	// The client keeps this *http.Client (TLS set up): count its failures.
	consulCfg.HttpClient.Transport = a.metrics.CountingTransport(consulCfg.HttpClient.Transport)
	key, err := consulkv.StampKey(ctx, a.consul.KV(), cfg.Consul.KVPrefix)
	if err != nil {
		return err
	}
	a.stamper = nomadjob.Stamper{Key: key}
	return nil
}

// region is another Nomad region the broker governs: its client (every
// call names the region) and its view.
type region struct {
	nomad *nomadapi.Client
	view  *cluster.View
}

// setupPolicy makes the cluster views, one per region governed (each counts
// only jobs whose stamp verifies), and loads the policy, refusing an invalid
// one with its diagnostics.
func (a *Agent) setupPolicy(context.Context) error {
	a.budgets, a.owed = &gpuusage.BudgetBook{}, &queue.OwedBook{}
	newView := func() *cluster.View {
		v := cluster.NewView(a.stamper.VerifyCounting)
		v.SetBudgets(a.budgets.OverBudget)
		v.SetOwed(a.owed.Since)
		return v
	}
	a.view = newView()
	views := map[string]*cluster.View{}
	for name, r := range a.others {
		r.view = newView()
		r.view.SetRegion(name)
		a.others[name], views[name] = r, r.view
	}
	a.regions = cluster.NewRegions(a.region, a.view, views)
	a.regions.Addresses = map[string]string{}
	for _, r := range a.cfg.Regions {
		a.regions.Addresses[r.Name] = r.Address
	}
	policies, diags := policystore.New(a.cfg.PolicyDir, a.regions.Capacity, a.log.Named("policy"))
	if policies == nil {
		return fmt.Errorf("policy %s is invalid:\n%s", a.cfg.PolicyDir, policyhcl.FormatDiagnostics(diags))
	}
	policies.AllowNoTenants = a.cfg.AllowPolicyWithoutTenants
	a.policies = policies
	return nil
}

// setupNomadAgent asks Nomad for its region and whether it enforces ACLs,
// which exclusive enforcement needs, and makes the clients of the other
// regions the broker governs and the client to the other brokers.
func (a *Agent) setupNomadAgent(ctx context.Context) error {
	agentRegion, acls, err := a.nomad.Agent(ctx)
	if err != nil {
		return err
	}
	a.acls, a.exclusive = acls, a.cfg.Enforcement == config.Exclusive
	if a.exclusive && !acls {
		return errors.New(`enforcement = "exclusive" needs Nomad's ACLs on: without them Nomad cannot refuse the writes that do not come through the broker`)
	}
	if a.peers, err = peerClient(a.cfg.TLS); err != nil {
		return err
	}
	a.region = a.cfg.Nomad.Region
	if a.region == "" {
		a.region = agentRegion
	}
	a.stamper.Region = a.region // stamps bind the region a job is stored in
	return a.regionClients()
}

// regionClients makes a client for each other region of broker.hcl: at its
// address, else through the broker's own agent, which forwards.
func (a *Agent) regionClients() error {
	a.others = map[string]region{}
	clients := map[string]*nomadapi.Client{}
	for _, r := range a.cfg.Regions {
		if r.Name == a.region {
			if r.Address != "" {
				return fmt.Errorf("region %q is the broker's own (its Nomad agent's): it is reached at nomad.address, so give it no address", r.Name)
			}
			continue
		}
		address := r.Address
		if address == "" {
			address = a.cfg.Nomad.Address
		}
		c, err := nomadapi.NewInRegion(r.Name, address, a.nomad.Token(), a.tlsCfg)
		if err != nil {
			return fmt.Errorf("region %q: %w", r.Name, err)
		}
		hc := c.HTTPClient()
		hc.Transport = a.metrics.NomadTransport(hc.Transport)
		a.others[r.Name], clients[r.Name] = region{nomad: c}, c
	}
	a.nomad.SetRegions(clients)
	return nil
}

// regionalNomad is the broker's Nomad client reading a queued job's versions
// in its region (decide.RegionVersions).
type regionalNomad struct{ *nomadapi.Client }

func (n regionalNomad) In(region string) decide.Versions { return n.Region(region) }

// setupStores makes the records in Consul KV (an unreadable one is set
// aside, counted and logged) and starts following those every broker reads.
func (a *Agent) setupStores(ctx context.Context) error {
	kv, prefix, kvLog := a.consul.KV(), a.cfg.Consul.KVPrefix, a.log.Named("consul")
	aside := consulkv.NewAside(a.consul, prefix, func(u consulkv.Unreadable) {
		a.metrics.KVUnreadable(u.Kind)
		kvLog.Error("a record that cannot be read was set aside; the others are read on", "kind", u.Kind, "key", u.Key,
			"moved_to", u.MovedTo, "error", u.Err)
	})
	a.stores = stores{aside: aside, queue: consulkv.NewQueue(kv, prefix, aside), decisions: consulkv.NewDecisions(kv, prefix, aside),
		scales: consulkv.NewScales(kv, prefix, a.region, aside), stops: consulkv.NewStops(kv, prefix, a.region, aside),
		writes: consulkv.NewRegistrations(kv, prefix, a.region, aside), approvals: consulkv.NewApprovals(kv, prefix, aside),
		backoffs: consulkv.NewBackoffs(kv, prefix, aside), holds: consulkv.NewHolds(kv, prefix), drains: consulkv.NewDrains(kv, prefix), profiles: gpuusage.NewProfiles(),
		storedProfiles: consulkv.NewProfiles(a.consul, prefix, aside), rollups: consulkv.NewRollups(a.consul, prefix, aside)}
	go a.stores.approvals.Follow(ctx)
	go a.stores.stops.Follow(ctx)
	go a.stores.writes.Follow(ctx)
	go a.stores.backoffs.Follow(ctx)
	go a.stores.holds.Follow(ctx, a.regions.HoldNodes) // the leader's holds, in every broker's gate
	go a.stores.drains.Follow(ctx, a.regions.SetDrained)
	go a.stores.queue.Follow(ctx) // the queue's index: the leader skips passes while nothing changed
	return nil
}

// setupObservers makes the leader election, the metrics' sources, the audit
// trail, what a policy reload tells them (its new names' series, its audit
// record) and the view's observers of allocation events and auto-reverts.
func (a *Agent) setupObservers(context.Context) error {
	cfg, st := a.cfg, &a.stores
	a.forecast = &queue.Forecast{}
	a.elector = &leader.Elector{Client: a.consul, Key: cfg.Consul.KVPrefix + "leader", Address: cfg.Advertise, Log: a.log.Named("leader"), Clock: a.clock}
	a.metrics.Observe(brokermetrics.Sources{Cluster: a.regions, Regions: a.regions, Policies: a.policies, Queue: st.queue, Leader: a.elector,
		PolicyState: a.policies.Loaded, TokenRefused: a.nomad.TokenRefused, InBackoff: func() map[string]int {
			return admission.InBackoffByTenant(a.policies.Current(), st.backoffs.Evicted(), a.clock.Now())
		},
		NomadConnections: a.nomad.Connections().Open})
	a.view.SetAllocEvents(a.metrics.AllocEvent)
	if c := cfg.Audit; c != nil {
		trail, err := audit.Open(c.Path, c.MaxBytes, c.MaxFiles, cfg.Advertise)
		if err != nil {
			return err
		}
		a.trail = trail
		trail.Failed = func(err error) {
			a.metrics.AuditFailure()
			a.log.Error("audit trail cannot be written", "error", err)
		}
	}
	a.policies.Reloads = func(took bool, detail string) {
		if took {
			a.metrics.Named(a.policies.Current())
		}
		if a.trail != nil {
			a.trail.Write(audit.Event{Who: audit.BrokerAct, What: audit.PolicyReload, Result: detail})
		}
	}
	// A revert in any region is recorded, its tenant's usage counting all.
	reverts := (&leader.Reverts{Leader: a.elector, Policies: a.policies, Audit: a.trail, Metrics: a.metrics, Log: a.log.Named("revert"),
		Writes: st.writes, Clock: a.clock,
		Usage: func(p *policy.Policy) admission.Usage { return a.regions.UsageWithout(p, "", "") }})
	for _, v := range a.regions.Views() {
		v.SetReverts(reverts.Observed)
		v.SetRollbacks(reverts.RecordWrite)
	}
	return nil
}

// setupServer makes the queue's admitter (run while leading) and the HTTP
// front, the gate and the broker's API.
func (a *Agent) setupServer(context.Context) error {
	cfg, st := a.cfg, &a.stores
	// 32 registrations in flight stays well inside Nomad's default limit of 100
	// HTTP connections per client.
	a.admitter = &admitter.Admitter{Log: a.log.Named("queue"), Queue: st.queue, Nomad: regionalNomad{a.nomad}, Cluster: a.regions,
		Policies: a.policies, Stamper: a.stamper, Clock: a.clock, GPUsCameBack: a.regions.GPUsCameBack, Blocked: a.unblockers(), Exclusive: a.exclusive,
		Metrics: a.metrics, FairShare: st.rollups, Audit: a.trail, Approvals: st.approvals, Preemptions: st.backoffs.Preemptions, Stops: st.stops, Writes: st.writes, Owed: a.owed,
		Placed: func(ctx context.Context, region, namespace, id string, index uint64) (string, error) {
			return a.nomad.Region(region).PlacedNothing(ctx, namespace, id, index)
		}, Parallel: 32, Synced: a.view.Synced, Holds: st.holds}
	gpu, err := gpuapi.New(gpuapi.Options{Log: a.log.Named("proxy"), Nomad: cfg.Nomad.Address, Client: a.nomad.HTTPClient(),
		Policies: a.policies, Cluster: a.regions, Regions: a.regions, Drains: st.drains, Queue: st.queue, Decisions: st.decisions,
		RightSizing: st.storedProfiles, Metrics: a.metrics, Rollups: st.rollups, FairShare: st.rollups, Audit: a.trail,
		Approvals: st.approvals, Preemptions: st.backoffs.Preemptions, SetAside: st.aside, PolicyStatus: a.policies.Status,
		Unhealthy: a.nomad.Unhealthy, Synced: a.view.Synced, Forecast: a.forecast, Region: a.region, ACLs: a.acls,
		Exclusive: a.exclusive, Clock: a.clock})
	if err != nil {
		return fmt.Errorf("the broker's API: %w", err)
	}
	a.server, err = server.New(server.Options{Leader: a.elector, Log: a.log.Named("proxy"), Nomad: cfg.Nomad.Address, MaxQueueBytes: cfg.MaxQueueBytes,
		Client: a.nomad.HTTPClient(), Policies: a.policies, Cluster: a.regions, Regions: a.regions, Queue: st.queue, Scales: st.scales, Stops: st.stops, Writes: st.writes,
		Profiles: st.profiles, Metrics: a.metrics, FairShare: st.rollups, Audit: a.trail,
		Approvals: st.approvals, Preemptions: st.backoffs.Preemptions, Synced: a.view.Synced, Forecast: a.forecast, Stamper: a.stamper, Region: a.region, ACLs: a.acls,
		BodyReadTimeout: cfg.BodyReadTimeoutDuration, Exclusive: a.exclusive, Token: a.nomad.Token, Peers: a.peers, Clock: a.clock, API: gpu.Handler()})
	return err
}

// follow starts what every broker runs until ctx ends: the view following
// Nomad (listed again every resync), and policy and token reloads.
func (a *Agent) follow(ctx context.Context) {
	resync := time.NewTicker(a.cfg.ResyncInterval)
	go func() {
		defer resync.Stop()
		a.view.Follow(ctx, a.nomad, a.log.Named("cluster"), resync.C)
	}()
	for name, r := range a.others {
		resync := time.NewTicker(a.cfg.ResyncInterval)
		go func() {
			defer resync.Stop()
			r.view.Follow(ctx, r.nomad, a.log.Named("cluster").With("region", name), resync.C)
		}()
	}
	policyReload := make(chan os.Signal, 1)
	go a.reloads(ctx, policyReload)
	go a.policies.Watch(ctx, policyReload, a.cfg.PolicyPollInterval)
}

// serve listens and serves the HTTP front (with Go's profiler when
// enable_debug is set) in the background.
func (a *Agent) serve() (*http.Server, error) {
	cfg := a.cfg
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	httpServer := &http.Server{Handler: debugHandler(cfg.EnableDebug, a.server.Handler()), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: serverLog(a.log.Named("http"))}
	if cfg.TLS != nil {
		go httpServer.ServeTLS(ln, cfg.TLS.CertFile, cfg.TLS.KeyFile)
	} else {
		go httpServer.Serve(ln)
	}
	a.log.Info("broker listening", "address", cfg.Listen, "tls", cfg.TLS != nil, "enforcement", cfg.Enforcement, "nomad", cfg.Nomad.Address,
		"consul", cfg.Consul.Address, "policy_dir", cfg.PolicyDir, "region", a.region, "acls", a.acls)
	return httpServer, nil
}

// serverLog is the HTTP server's error log in the broker's. A connection
// closed before its TLS handshake began is logged at debug level only. The
// followers' check of the leader's address (every half second) and load
// balancers' TCP checks are such connections; at the default level they
// would fill the log.
func serverLog(l hclog.Logger) *log.Logger {
	return log.New(serverLogWriter{l}, "", 0)
}

type serverLogWriter struct{ log hclog.Logger }

func (w serverLogWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	if strings.HasPrefix(msg, "http: TLS handshake error") && strings.HasSuffix(msg, ": EOF") {
		w.log.Debug(msg)
	} else {
		w.log.Warn(msg)
	}
	return len(p), nil
}

// lead runs the leader's loops for one term, until ctx ends: Nomad's
// preemption kept as policy says, reclaim with its watchers, and the queue.
func (a *Agent) lead(ctx context.Context) {
	reassert := time.NewTicker(a.cfg.PreemptionReassertInterval)
	defer reassert.Stop()
	go leader.KeepPreemption(ctx, reassert.C, a.policies.Reloaded(), a.policies.Preemption, a.nomad, a.log.Named("preemption"))
	go a.reclaimer().Run(ctx)
	passes := time.NewTicker(a.cfg.QueueIntervalDuration)
	defer passes.Stop()
	a.admitter.Run(ctx, a.regions.Changed(ctx), passes.C)
}

// reclaimer is one term's reclaim loop: each term starts afresh, and what
// earlier leaders recorded is read back.
func (a *Agent) reclaimer() *reclaimer.Reclaimer {
	st := &a.stores
	observer := &nomadapi.Observer{Client: a.nomad, View: a.view, Verify: decide.Verifier(a.stamper, a.records()), Samples: a.view.SetSamples}
	prune := a.log.Named("prune")
	granted := approval.ExtraGranted(a.policies, st.approvals)
	elsewhere := a.elsewhere(observer.Verify)
	return &reclaimer.Reclaimer{Elsewhere: elsewhere, Home: a.region, Log: a.log.Named("reclaim"), Records: st.decisions, Observer: observer, Actor: a.nomad, Policies: a.policies,
		Clock: a.clock, NewID: queue.NewID,
		Requeue: &reclaimer.Requeue{Jobs: a.nomad, Actor: a.nomad, Queue: st.queue, Policies: a.policies, Preempted: st.backoffs.Preempted},
		Watchers: append([]reclaimer.Watcher{&reclaimer.Recorder{Store: st.storedProfiles, Table: st.profiles, Policies: a.policies},
			&reclaimer.Ledger{Store: st.rollups, Region: a.region, Policies: a.policies, Metrics: a.metrics, Budgets: a.budgets, Clock: a.nomad.NomadNow,
				Ended: observer.Ended, EndedSince: observer.EndedSince, Granted: granted, Elsewhere: elsewhere},
			&reclaimer.Bander{Log: a.log.Named("band"), Policies: a.policies, Usage: a.regions, Jobs: a.nomad, Elsewhere: a.otherClients(), Grants: st.scales,
				Stops: st.stops, Writes: st.writes, Stamper: a.stamper, Lock: a.view.LockJob, Audit: a.trail},
			&reclaimer.Repinner{Log: a.log.Named("repin"), Policies: a.policies, View: a.view, Jobs: a.nomad, Elsewhere: a.repinRegions(), Records: a.records(),
				Writes: st.writes, Stamper: a.stamper, Lock: a.view.LockJob, Audit: a.trail},
			&reclaimer.StopRecorder{View: a.view, Records: st.stops, Writes: st.writes, Lock: a.view.LockJob},
			&reclaimer.RegionLoss{Log: a.log.Named("region-loss"), Policies: a.policies, Regions: a.regions, Queue: st.queue, Audit: a.trail,
				Stop: func(ctx context.Context, region, namespace, id string) (string, error) {
					return a.nomad.Region(region).StopJob(ctx, namespace, id)
				}},
			&reclaimer.Expirer{Store: st.approvals, Jobs: a.regions, Policies: a.policies, Records: st.decisions, NewID: queue.NewID, Audit: a.trail},
			&reclaimer.Pruner{What: "scale and dispatch grants", Every: grantPruneInterval, Log: prune,
				Prune: func(ctx context.Context) (int, error) { return st.scales.Prune(ctx, a.gone) }},
			&reclaimer.Pruner{What: "queued requests no entry owns", Every: grantPruneInterval, Log: prune, Prune: st.queue.PruneRequests},
			&reclaimer.Pruner{What: "records of the broker's writes", Every: grantPruneInterval, Log: prune,
				Prune: func(ctx context.Context) (int, error) { return st.writes.Prune(ctx, a.gone) }},
			// A stop is kept for the reclaim retention (Nomad collects a
			// stopped job within hours): a replay of its stamp after that
			// verifies again.
			&reclaimer.Pruner{What: "stopped-job records", Every: grantPruneInterval, Log: prune,
				Prune: func(ctx context.Context) (int, error) {
					return st.stops.Prune(ctx, a.clock.Now().Add(-a.policies.Current().ReclaimSettings.Retention))
				}},
			// A job counts its evictions for its life: the count of one
			// gone (neither queued nor running) is forgotten once left
			// alone for max_backoff after its backoff ended.
			&reclaimer.Pruner{What: "preemption counts", Every: grantPruneInterval, Log: prune,
				Prune: func(ctx context.Context) (int, error) {
					entries, err := st.queue.List(ctx)
					if err != nil {
						return 0, err
					}
					queued := map[string]bool{}
					for _, e := range entries {
						queued[admission.JobKey(e.Namespace, e.JobID)] = true
					}
					return st.backoffs.Prune(ctx, a.clock.Now(), a.policies.Current().Borrowing.ForgetAfter,
						func(ns, job string) bool { return queued[admission.JobKey(ns, job)] || a.regions.Running(ns, job) })
				}}}, a.otherStopRecorders()...),
		Metrics: a.metrics, Audit: a.trail, Forecast: a.forecast, Queued: st.queue,
		Granted: granted}
}

// elsewhere observes the other regions for the reclaim rules and the usage
// ledger, and acts there (nil: the broker governs one), each region through
// its own client and view.
func (a *Agent) elsewhere(verify func(context.Context, *nomad.Job) (bool, bool)) *reclaimer.Elsewhere {
	if len(a.others) == 0 {
		return nil
	}
	observers := map[string]reclaimer.RegionObserver{}
	for name, r := range a.others {
		observers[name] = &nomadapi.Observer{Client: a.nomad.Region(name), View: r.view, Verify: verify, Samples: r.view.SetSamples}
	}
	return &reclaimer.Elsewhere{Log: a.log.Named("reclaim"), Observers: observers,
		In: func(region string) reclaimer.RegionalActor { return a.nomad.Region(region) }}
}

// reloads reads nomad.token_file again at each SIGHUP (a revoked or rotated
// token is replaced with no restart, and the queue goes on at its next pass),
// then passes the signal on for the policy to be read again.
func (a *Agent) reloads(ctx context.Context, policy chan<- os.Signal) {
	nomadClient := a.nomad
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
					if err := a.setToken(tok); err != nil {
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

// otherStopRecorders record the stops of the broker's admissions in each
// other region, as the one in its watchers does in its own: a stamp copied
// into a registration straight in that region must not verify.
func (a *Agent) otherStopRecorders() []reclaimer.Watcher {
	var out []reclaimer.Watcher
	for _, name := range slices.Sorted(maps.Keys(a.others)) {
		out = append(out, &reclaimer.StopRecorder{View: a.others[name].view, Records: a.stores.stops, Writes: a.stores.writes, Region: name, Lock: a.view.LockJob})
	}
	return out
}

// records are what the broker keeps of its admissions besides stamps.
func (a *Agent) records() decide.Records {
	return decide.Records{Grants: a.stores.scales, Stops: a.stores.stops, Registrations: a.stores.writes}
}

// gone reports whether the region of a job's record no longer has it, or
// for a record of no region (written before records were keyed by one),
// whether no region governed has it. A region that cannot be asked keeps
// it; one no longer governed has nothing the broker decides on.
func (a *Agent) gone(ctx context.Context, job nomadjob.Ref) (bool, error) {
	if job.Region != "" {
		in := a.nomad
		if job.Region != a.region {
			r, ok := a.others[job.Region]
			if !ok {
				return true, nil
			}
			in = r.nomad
		}
		return in.Gone(ctx, job.Namespace, job.ID)
	}
	if gone, err := a.nomad.Gone(ctx, job.Namespace, job.ID); err != nil || !gone {
		return false, err
	}
	for name, r := range a.others {
		switch gone, err := r.nomad.Gone(ctx, job.Namespace, job.ID); {
		case err != nil:
			return false, fmt.Errorf("region %s: %w", name, err)
		case !gone:
			return false, nil
		}
	}
	return true, nil
}

// unblockers re-evaluate the blocked jobs of every region governed: healthy
// GPUs that came back anywhere count (GPUsCameBack counts every region).
func (a *Agent) unblockers() unblockEverywhere {
	out := unblockEverywhere{a.nomad}
	for _, name := range slices.Sorted(maps.Keys(a.others)) {
		out = append(out, a.others[name].nomad)
	}
	return out
}

// unblockEverywhere is each region's client, the broker's own first.
type unblockEverywhere []*nomadapi.Client

func (u unblockEverywhere) ReevaluateBlocked(ctx context.Context) (int, error) {
	n := 0
	var errs []error
	for _, c := range u {
		k, err := c.ReevaluateBlocked(ctx)
		n += k
		errs = append(errs, err)
	}
	return n, errors.Join(errs...)
}

// repinRegions are the other regions as the repinner reads and registers
// their jobs: each through its own view and client.
func (a *Agent) repinRegions() map[string]reclaimer.RepinRegion {
	out := map[string]reclaimer.RepinRegion{}
	for name, r := range a.others {
		out[name] = reclaimer.RepinRegion{View: r.view, Jobs: r.nomad}
	}
	return out
}

// otherClients are the other regions' Nomad clients, by name.
func (a *Agent) otherClients() map[string]reclaimer.PromoteJobs {
	out := map[string]reclaimer.PromoteJobs{}
	for name, r := range a.others {
		out[name] = r.nomad
	}
	return out
}

// setToken makes tok the token of every region's client.
func (a *Agent) setToken(tok string) error {
	if err := a.nomad.SetToken(tok); err != nil {
		return err
	}
	for name, r := range a.others {
		if err := r.nomad.SetToken(tok); err != nil {
			return fmt.Errorf("region %q: %w", name, err)
		}
	}
	return nil
}

// warmEvery is how often a broker standing by looks for queued jobs it has
// not prepared yet (admitter.Warm).
const warmEvery = 2 * time.Second

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
