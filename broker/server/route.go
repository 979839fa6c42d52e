package server

import (
	"net/http"
	"path"
	"strings"
)

// call is what the gate does with a Nomad API call.
type call int

const (
	callNone call = iota // passed through as it is
	callRegister
	callPlan
	callValidate
	callScale
	callDispatch
	callRevert
	callPeriodicForce
	// callStable marks a job version stable or not: Nomad writes the version
	// named back as the job's current one, so on an older version it is a
	// revert that creates no evaluation and publishes no event.
	callStable
	// callEvaluate evaluates a job again: on one that runs nothing, or with
	// failed allocations forced to reschedule, Nomad places its count again.
	callEvaluate
	// callJobWrite is any other job write (a stop): it grows no GPU demand,
	// but with exclusive enforcement only the broker may make it.
	callJobWrite
	// callDeploymentWrite is a job write on a deployment, by its id.
	callDeploymentWrite
)

func (c call) String() string {
	return [...]string{"", "register", "plan", "validate", "scale", "dispatch", "revert", "periodic force", "stable",
		"evaluate", "job write", "deployment write"}[c]
}

// class is what the gate does with a write, by its route.
type class int

const (
	// unknown: not in the table (a newer Nomad's route, or a method Nomad
	// does not write on there). Refused with exclusive enforcement; passed
	// through, logged and counted otherwise.
	unknown class = iota
	// read: a GET, passed through.
	read
	// decided: it can create or grow GPU demand, or bring an older version
	// back: admission decides it (or, for a job write, who may make it).
	decided
	// neutral: passed through; the route's why says why it cannot change
	// GPU demand.
	neutral
	// refused: never passed on; why says why.
	refused
)

// nomadRoute is a route of Nomad v1.6's HTTP API and what its writes do.
type nomadRoute struct {
	// mux is the pattern Nomad's router registers (command/agent/http.go).
	mux string
	// sub is the sub-route its handler picks from the rest of the path
	// (tried in table order, as the handler does): "/x" the rest ends in
	// /x, "x/" it starts with x/; "" the handler's default.
	sub string
	// methods are the methods Nomad writes on there, space-separated ("*":
	// every method, the handler does not look); none: it only reads.
	methods string
	class   class
	call    call
	// why a neutral route cannot change GPU demand, or why a refused one is.
	why string
}

// Reasons shared by many routes.
const (
	readsOnly   = "reads only: Nomad answers any other method with 405"
	anyMethod   = "*"
	writeMethod = "PUT POST"
	aclWrite    = "ACL objects: who may do what, never a job's demand; Nomad asks for a management token"
	agentWrite  = "the agent's own state (membership, servers, keys, workers): no job's demand"
	clientRead  = "served by a client from a running allocation or node; changes no job"
)

// nomadRoutes is every route Nomad v1.6.3 registers, in its order, with
// every write it serves classified. TestEveryNomadRouteIsClassified reads
// Nomad's source and fails on a route this table does not have.
var nomadRoutes = []nomadRoute{
	{mux: "/v1/jobs", methods: writeMethod, class: decided, call: callRegister},
	{mux: "/v1/jobs/parse", methods: writeMethod, class: neutral, why: "parses HCL into a job and returns it; registers nothing"},
	// /v1/job/<id>/<sub>: Nomad tries these suffixes in this order.
	{mux: "/v1/job/", sub: "/evaluate", methods: writeMethod, class: decided, call: callEvaluate},
	{mux: "/v1/job/", sub: "/allocations", why: readsOnly},
	{mux: "/v1/job/", sub: "/evaluations", why: readsOnly},
	{mux: "/v1/job/", sub: "/periodic/force", methods: writeMethod, class: decided, call: callPeriodicForce},
	{mux: "/v1/job/", sub: "/plan", methods: writeMethod, class: decided, call: callPlan},
	{mux: "/v1/job/", sub: "/summary", why: readsOnly},
	{mux: "/v1/job/", sub: "/dispatch", methods: writeMethod, class: decided, call: callDispatch},
	{mux: "/v1/job/", sub: "/versions", why: readsOnly},
	{mux: "/v1/job/", sub: "/revert", methods: writeMethod, class: decided, call: callRevert},
	{mux: "/v1/job/", sub: "/deployments", why: readsOnly},
	{mux: "/v1/job/", sub: "/deployment", why: readsOnly},
	{mux: "/v1/job/", sub: "/stable", methods: writeMethod, class: decided, call: callStable},
	{mux: "/v1/job/", sub: "/scale", methods: writeMethod, class: decided, call: callScale},
	{mux: "/v1/job/", sub: "/services", why: readsOnly},
	{mux: "/v1/job/", sub: "/submission", why: readsOnly},
	{mux: "/v1/job/", methods: writeMethod, class: decided, call: callRegister},
	{mux: "/v1/job/", methods: "DELETE", class: neutral, call: callJobWrite,
		why: "stops or purges the job: frees its GPUs, and its evaluation places nothing (v1.6.3 nomad/job_endpoint.go, Job.Deregister)"},
	{mux: "/v1/nodes", why: readsOnly},
	{mux: "/v1/node/", methods: writeMethod, class: neutral,
		why: "drain, eligibility, evaluate and purge move or stop allocations; a job places no more than the count it was charged, and system jobs are pinned to the nodes counted " +
			"(v1.6.3 nomad/node_endpoint.go: Node.UpdateDrain, UpdateEligibility, Evaluate, Deregister)"},
	{mux: "/v1/node/pools", methods: writeMethod, class: neutral, why: "node pools: where jobs may run, not how many GPUs they hold"},
	{mux: "/v1/node/pool/", methods: writeMethod + " DELETE", class: neutral, why: "node pools: where jobs may run, not how many GPUs they hold"},
	{mux: "/v1/allocations", why: readsOnly},
	{mux: "/v1/allocation/", methods: writeMethod, class: neutral,
		why: "stop and signal: Nomad replaces a stopped allocation within its job's count (v1.6.3 nomad/alloc_endpoint.go, Alloc.Stop)"},
	{mux: "/v1/evaluations", methods: "DELETE", class: neutral, why: "deletes evaluations (scheduler paused): places nothing (v1.6.3 nomad/eval_endpoint.go, Eval.Delete)"},
	{mux: "/v1/evaluations/count", why: readsOnly},
	{mux: "/v1/evaluation/", why: readsOnly},
	{mux: "/v1/deployments", why: readsOnly},
	// /v1/deployment/<sub><id>: a fail, or allocations marked unhealthy, in an
	// auto_revert deployment makes Nomad revert the job (deploymentWrite).
	{mux: "/v1/deployment/", sub: "allocations/", why: readsOnly},
	{mux: "/v1/deployment/", sub: "fail/", methods: writeMethod, class: decided, call: callDeploymentWrite},
	{mux: "/v1/deployment/", sub: "pause/", methods: writeMethod, class: decided, call: callDeploymentWrite},
	{mux: "/v1/deployment/", sub: "promote/", methods: writeMethod, class: decided, call: callDeploymentWrite},
	{mux: "/v1/deployment/", sub: "allocation-health/", methods: writeMethod, class: decided, call: callDeploymentWrite},
	{mux: "/v1/deployment/", sub: "unblock/", methods: writeMethod, class: decided, call: callDeploymentWrite},
	{mux: "/v1/deployment/", why: readsOnly},
	{mux: "/v1/volumes", methods: writeMethod, class: neutral, why: "CSI volumes: storage, no GPU"},
	{mux: "/v1/volumes/external", why: readsOnly},
	{mux: "/v1/volumes/snapshot", methods: writeMethod + " DELETE", class: neutral, why: "CSI snapshots: storage, no GPU"},
	{mux: "/v1/volume/csi/", methods: "PUT POST DELETE", class: neutral, why: "CSI volumes: storage, no GPU"},
	{mux: "/v1/plugins", why: readsOnly},
	{mux: "/v1/plugin/csi/", why: readsOnly},
	{mux: "/v1/acl/policies", why: readsOnly},
	{mux: "/v1/acl/policy/", methods: writeMethod + " DELETE", class: neutral, why: aclWrite},
	{mux: "/v1/acl/token/onetime", methods: writeMethod, class: neutral, why: aclWrite},
	{mux: "/v1/acl/token/onetime/exchange", methods: writeMethod, class: neutral, why: aclWrite},
	{mux: "/v1/acl/bootstrap", methods: writeMethod, class: neutral, why: aclWrite},
	{mux: "/v1/acl/tokens", why: readsOnly},
	{mux: "/v1/acl/token", methods: writeMethod, class: neutral, why: aclWrite},
	{mux: "/v1/acl/token/", methods: writeMethod + " DELETE", class: neutral, why: aclWrite},
	{mux: "/v1/acl/roles", why: readsOnly},
	{mux: "/v1/acl/role", methods: writeMethod, class: neutral, why: aclWrite},
	{mux: "/v1/acl/role/", methods: writeMethod + " DELETE", class: neutral, why: aclWrite},
	{mux: "/v1/acl/auth-methods", why: readsOnly},
	{mux: "/v1/acl/auth-method", methods: writeMethod, class: neutral, why: aclWrite},
	{mux: "/v1/acl/auth-method/", methods: writeMethod + " DELETE", class: neutral, why: aclWrite},
	{mux: "/v1/acl/binding-rules", why: readsOnly},
	{mux: "/v1/acl/binding-rule", methods: writeMethod, class: neutral, why: aclWrite},
	{mux: "/v1/acl/binding-rule/", methods: writeMethod + " DELETE", class: neutral, why: aclWrite},
	{mux: "/v1/acl/oidc/auth-url", methods: writeMethod, class: neutral, why: "starts an OIDC login: no job"},
	{mux: "/v1/acl/oidc/complete-auth", methods: writeMethod, class: neutral, why: "completes an OIDC login: no job"},
	{mux: "/v1/acl/login", methods: writeMethod, class: neutral, why: "logs in: no job"},
	{mux: "/v1/client/fs/", methods: anyMethod, class: neutral, why: clientRead},
	{mux: "/v1/client/gc", methods: anyMethod, class: neutral,
		why: "collects a client's dead allocations: frees, never places (v1.6.3 nomad/client_alloc_endpoint.go, ClientAllocations.GarbageCollectAll)"},
	{mux: "/v1/client/stats", methods: anyMethod, class: neutral, why: clientRead},
	{mux: "/v1/client/allocation/", methods: anyMethod, class: neutral,
		why: "restart, signal, exec, gc, stats or checks of one running allocation: its GPUs stay what they were (v1.6.3 nomad/client_alloc_endpoint.go)"},
	{mux: "/v1/client/metadata", methods: "POST", class: neutral, why: "a node's dynamic metadata: the broker's pins name node ids, and it reads no node metadata"},
	{mux: "/v1/agent/self", why: readsOnly},
	{mux: "/v1/agent/join", methods: writeMethod, class: neutral, why: agentWrite},
	{mux: "/v1/agent/members", why: readsOnly},
	{mux: "/v1/agent/force-leave", methods: writeMethod, class: neutral, why: agentWrite},
	{mux: "/v1/agent/servers", methods: writeMethod, class: neutral, why: agentWrite},
	{mux: "/v1/agent/schedulers", why: readsOnly},
	{mux: "/v1/agent/schedulers/config", methods: writeMethod, class: neutral, why: agentWrite},
	{mux: "/v1/agent/keyring/", methods: anyMethod, class: neutral, why: agentWrite},
	{mux: "/v1/agent/health", why: readsOnly},
	{mux: "/v1/agent/host", why: readsOnly},
	{mux: "/v1/services", why: readsOnly},
	{mux: "/v1/service/", methods: "DELETE", class: neutral, why: "removes a service registration: no allocation"},
	{mux: "/v1/agent/monitor", methods: anyMethod, class: neutral, why: "streams the agent's logs, whatever the method"},
	{mux: "/v1/agent/pprof/", methods: anyMethod, class: neutral, why: "profiles the agent, whatever the method"},
	{mux: "/v1/metrics", why: readsOnly},
	{mux: "/v1/validate/job", methods: writeMethod, class: decided, call: callValidate},
	{mux: "/v1/regions", why: readsOnly},
	{mux: "/v1/scaling/policies", why: readsOnly},
	{mux: "/v1/scaling/policy/", why: readsOnly},
	{mux: "/v1/status/leader", why: readsOnly},
	{mux: "/v1/status/peers", why: readsOnly},
	{mux: "/v1/search/fuzzy", methods: writeMethod, class: neutral, why: "a search: a read sent as a write"},
	{mux: "/v1/search", methods: writeMethod, class: neutral, why: "a search: a read sent as a write"},
	{mux: "/v1/operator/license", methods: "PUT", class: neutral, why: "the license (Enterprise only): no job"},
	{mux: "/v1/operator/raft/", methods: "DELETE", class: neutral, why: "removes a raft peer: no job"},
	{mux: "/v1/operator/keyring/", methods: writeMethod + " DELETE", class: neutral, why: agentWrite},
	{mux: "/v1/operator/autopilot/configuration", methods: "PUT", class: neutral, why: "autopilot settings: no job"},
	{mux: "/v1/operator/autopilot/health", why: readsOnly},
	{mux: "/v1/operator/snapshot", methods: writeMethod, class: refused,
		why: "restoring a snapshot brings back every job as it was then, past admission; restore it on Nomad itself, and the broker's reclaim rules judge what then runs"},
	{mux: "/v1/system/gc", methods: "PUT", class: neutral, why: "collects dead jobs and allocations: frees, never places (v1.6.3 nomad/system_endpoint.go, System.GarbageCollect)"},
	{mux: "/v1/system/reconcile/summaries", methods: "PUT", class: neutral,
		why: "recounts job summaries: places nothing (v1.6.3 nomad/system_endpoint.go, System.ReconcileJobSummaries)"},
	{mux: "/v1/operator/scheduler/configuration", methods: writeMethod, class: neutral,
		why: "scheduler settings (Nomad asks for a management token); they change how Nomad places, not what a job is charged"},
	{mux: "/v1/event/stream", why: readsOnly},
	{mux: "/v1/namespaces", why: readsOnly},
	{mux: "/v1/namespace", methods: writeMethod, class: neutral, why: "namespaces: a job in one no tenant owns is decided like any other"},
	{mux: "/v1/namespace/", methods: writeMethod + " DELETE", class: neutral, why: "namespaces: a job in one no tenant owns is decided like any other"},
	{mux: "/v1/vars", why: readsOnly},
	{mux: "/v1/var/", methods: writeMethod + " DELETE", class: neutral,
		why: "variables hold data a template may read; what a job's spec does with it is judged at its registration"},
	{mux: "/ui/", methods: anyMethod, class: neutral, why: "Nomad's web UI: static files"},
	// Anything else falls through to "/": Nomad v1.6 answers 404, but a
	// newer Nomad may serve a write there, so a write is never known.
	{mux: "/", why: "Nomad's fallthrough: 404, or a route of a newer Nomad"},
	{mux: "/debug/pprof/", why: "served with enable_debug: reads only"},
	{mux: "/debug/pprof/cmdline", why: "served with enable_debug: reads only"},
	{mux: "/debug/pprof/profile", why: "served with enable_debug: reads only"},
	{mux: "/debug/pprof/symbol", why: "served with enable_debug: reads only"},
	{mux: "/debug/pprof/trace", why: "served with enable_debug: reads only"},
}

// routed is what the gate makes of a request.
type routed struct {
	class class
	call  call
	// id is the job's (or the deployment's) id in the path.
	id string
	// pattern is the route's pattern, for logs and metric labels: never
	// the caller's path.
	pattern string
	why     string
}

// route classifies a request by method and path, reading the path exactly
// as Nomad does: Go's ServeMux picks the longest pattern (r.URL.Path is
// unescaped once, on both sides), then the handler its sub-route; job ids
// may contain "/".
func route(method, p string) routed {
	mux := muxPattern(p)
	rest := strings.TrimPrefix(p, mux)
	var sub string
	for _, r := range nomadRoutes {
		if r.mux == mux && r.sub != "" && subMatches(r.sub, rest) {
			sub = r.sub
			break
		}
	}
	id := rest
	if strings.HasPrefix(sub, "/") {
		id = strings.TrimSuffix(rest, sub)
	} else if sub != "" {
		id = strings.TrimPrefix(rest, sub)
	}
	found := routed{class: unknown, pattern: patternOf(mux, sub), id: id}
	for _, r := range nomadRoutes {
		if r.mux != mux || r.sub != sub {
			continue
		}
		if method == http.MethodGet {
			return routed{class: read, pattern: found.pattern}
		}
		if hasMethod(r.methods, method) {
			found.class, found.call, found.why = r.class, r.call, r.why
			return found
		}
	}
	// HEAD and OPTIONS write nothing: Nomad's handlers answer them 405,
	// but on routes whose handler ignores the method (classified above).
	if method == http.MethodGet || method == http.MethodHead || method == http.MethodOptions {
		return routed{class: read, pattern: found.pattern}
	}
	return found
}

// muxPattern is the pattern of nomadRoutes that Go's ServeMux (Nomad's
// router) serves p at: the same path exactly, else the longest pattern
// ending in "/" that p starts with.
func muxPattern(p string) string {
	best := "/"
	for _, r := range nomadRoutes {
		switch {
		case r.mux == p:
			return p
		case strings.HasSuffix(r.mux, "/") && strings.HasPrefix(p, r.mux) && len(r.mux) > len(best):
			best = r.mux
		}
	}
	return best
}

func subMatches(sub, rest string) bool {
	if strings.HasPrefix(sub, "/") {
		return strings.HasSuffix(rest, sub)
	}
	return strings.HasPrefix(rest, sub)
}

// patternOf writes a route as a pattern: /v1/job/<id>/scale.
func patternOf(mux, sub string) string {
	switch {
	case strings.HasPrefix(sub, "/"):
		return mux + "<id>" + sub
	case sub != "":
		return mux + sub + "<id>"
	}
	return mux
}

func hasMethod(methods, method string) bool {
	if methods == anyMethod {
		return true
	}
	for _, m := range strings.Fields(methods) {
		if m == method {
			return true
		}
	}
	return false
}

// cleanPath is the path Go's ServeMux (Nomad's router) serves a request at: it
// redirects any other form there before a handler sees it.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		np += "/"
	}
	return np
}

// JobWrite is one job-scoped write the route table knows: Method on
// /v1/job/<id><Sub> (Sub "": the job itself).
type JobWrite struct {
	Method, Sub string
	// Decided: admission decides it; else it is passed through (Why).
	Decided bool
	Why     string
}

// JobWrites are the writes of the table on /v1/job/<id>, one method each
// (Nomad's handlers take PUT and POST alike), for tests that run each on
// jobs in every state: a route added to the table is one more case.
func JobWrites() []JobWrite {
	var out []JobWrite
	for _, r := range nomadRoutes {
		if r.mux != "/v1/job/" || r.methods == "" {
			continue
		}
		out = append(out, JobWrite{Method: strings.Fields(r.methods)[0], Sub: r.sub, Decided: r.class == decided, Why: r.why})
	}
	return out
}
