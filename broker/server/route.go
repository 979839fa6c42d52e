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
)

func (c call) String() string {
	return [...]string{"", "register", "plan", "validate", "scale", "dispatch", "revert", "periodic force"}[c]
}

// jobSuffixes are the sub-resources of /v1/job/<id> in the order Nomad v1.6
// tries them: the first suffix the path ends with wins, so a job whose id ends
// in "/plan" can only be planned, never registered, at that path.
var jobSuffixes = []struct {
	suffix string
	call   call // for PUT and POST
}{
	{"/evaluate", callNone}, {"/allocations", callNone}, {"/evaluations", callNone},
	{"/periodic/force", callPeriodicForce}, {"/plan", callPlan}, {"/summary", callNone},
	{"/dispatch", callDispatch}, {"/versions", callNone}, {"/revert", callRevert},
	{"/deployments", callNone}, {"/deployment", callNone}, {"/stable", callNone},
	{"/scale", callScale}, {"/services", callNone}, {"/submission", callNone},
}

// route names the call a request makes, and the job id in its path, reading
// the path exactly as Nomad does: r.URL.Path is unescaped once by Go's HTTP
// server on both sides, and job ids may contain "/".
func route(method, p string) (call, string) {
	if method != http.MethodPut && method != http.MethodPost {
		return callNone, "" // Nomad answers 405 or reads; nothing grows
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
