package server

import (
	"net/http"
	"path"
	"strings"
)

// call is a Nomad API call that can create or grow GPU demand.
type call int

const (
	callNone call = iota
	callRegister
	callPlan
	callValidate
	callScale
	callDispatch
	callRevert
	callPeriodicForce
	// callJobWrite is any other job write (stop, evaluate, stability,
	// deployment promote, fail, pause, health, unblock): it grows no GPU
	// demand, but with exclusive enforcement only the broker may make it.
	callJobWrite
	// callDeploymentWrite is a job write on a deployment, by its id.
	callDeploymentWrite
)

func (c call) String() string {
	return [...]string{"", "register", "plan", "validate", "scale", "dispatch", "revert", "periodic force", "job write", "deployment write"}[c]
}

// jobSuffixes are the sub-resources of /v1/job/<id> in the order Nomad v1.6
// tries them: the first suffix the path ends with wins, so a job whose id ends
// in "/plan" can only be planned, never registered, at that path.
var jobSuffixes = []struct {
	suffix string
	call   call // for PUT and POST
}{
	{"/evaluate", callJobWrite}, {"/allocations", callNone}, {"/evaluations", callNone},
	{"/periodic/force", callPeriodicForce}, {"/plan", callPlan}, {"/summary", callNone},
	{"/dispatch", callDispatch}, {"/versions", callNone}, {"/revert", callRevert},
	{"/deployments", callNone}, {"/deployment", callNone}, {"/stable", callJobWrite},
	{"/scale", callScale}, {"/services", callNone}, {"/submission", callNone},
}

// route names the call a request makes, and the job id in its path, reading
// the path exactly as Nomad does: r.URL.Path is unescaped once by Go's HTTP
// server on both sides, and job ids may contain "/".
func route(method, p string) (call, string) {
	if method == http.MethodDelete {
		return deleteRoute(p)
	}
	if method != http.MethodPut && method != http.MethodPost {
		return callNone, "" // Nomad answers 405 or reads; nothing grows
	}
	for _, prefix := range deploymentWrites {
		if id, ok := strings.CutPrefix(p, prefix); ok {
			return callDeploymentWrite, id
		}
	}
	switch p {
	case "/v1/jobs":
		return callRegister, ""
	case "/v1/validate/job":
		return callValidate, ""
	}
	rest, ok := strings.CutPrefix(p, "/v1/job/")
	if !ok {
		return callNone, ""
	}
	for _, s := range jobSuffixes {
		if id, ok := strings.CutSuffix(rest, s.suffix); ok {
			return s.call, id
		}
	}
	return callRegister, rest // "/v1/job/" alone registers whatever job the body names
}

// deploymentWrites are the deployment calls that need submit-job.
var deploymentWrites = []string{"/v1/deployment/promote/", "/v1/deployment/fail/", "/v1/deployment/pause/",
	"/v1/deployment/allocation-health/", "/v1/deployment/unblock/"}

// deleteRoute: DELETE /v1/job/<id> stops (deregisters) a job, unless the path
// ends in a sub-resource, which Nomad then answers (405) instead.
func deleteRoute(p string) (call, string) {
	rest, ok := strings.CutPrefix(p, "/v1/job/")
	if !ok {
		return callNone, ""
	}
	for _, s := range jobSuffixes {
		if strings.HasSuffix(rest, s.suffix) {
			return callNone, ""
		}
	}
	return callJobWrite, rest
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
