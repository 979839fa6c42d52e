// Package nomadjob translates between Nomad jobs and the broker's admission
// model: the GPU demand of a job, and the changes an admission makes to it.
package nomadjob

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
)

// Meta keys the broker writes on admitted jobs.
const (
	MetaTenant    = "nomad-gpu.tenant"
	MetaQueue     = "nomad-gpu.queue"
	MetaWorkload  = "nomad-gpu.workload"
	MetaBorrowed  = "nomad-gpu.borrowed"
	MetaAdmission = "nomad-gpu.admission"
)

// DefaultNamespace is Nomad's namespace when a job names none.
const DefaultNamespace = "default"

// Namespace is the job's namespace, else the request's, else Nomad's default.
func Namespace(job *api.Job, requestNamespace string) string {
	if job.Namespace != nil && *job.Namespace != "" {
		return *job.Namespace
	}
	if requestNamespace != "" {
		return requestNamespace
	}
	return DefaultNamespace
}

// IsGPU reports whether a device request is for NVIDIA GPUs, and which model.
func IsGPU(name string) (model string, ok bool) {
	parts := strings.SplitN(name, "/", 3)
	switch {
	case len(parts) == 1:
		return "", parts[0] == "gpu"
	case parts[1] != "gpu" || parts[0] != "nvidia":
		return "", false
	case len(parts) == 3:
		return parts[2], true
	default:
		return "", true
	}
}

// Admission is the job as admission sees it: its GPU demand per task group.
func Admission(job *api.Job, namespace string) admission.Job {
	out := admission.Job{Namespace: namespace}
	if job.ID != nil {
		out.ID = *job.ID
	}
	out.Queue = job.Meta[MetaQueue]
	for _, tg := range job.TaskGroups {
		g := admission.Group{Count: 1}
		if tg.Name != nil {
			g.Name = *tg.Name
		}
		if tg.Count != nil {
			g.Count = *tg.Count
		}
		for _, task := range tg.Tasks {
			if task.Resources == nil {
				continue
			}
			for _, dev := range task.Resources.Devices {
				model, ok := IsGPU(dev.Name)
				if !ok {
					continue
				}
				n := 1
				if dev.Count != nil {
					n = int(*dev.Count)
				}
				g.GPUsPerAlloc += n
				if model != "" {
					g.Model = model
				}
			}
		}
		if g.GPUsPerAlloc > 0 {
			out.Groups = append(out.Groups, g)
		}
	}
	return out
}

// Apply writes an admission into a job in its JSON form (as Nomad's API takes
// it), so that nothing else of what the user sent changes: the priority and the
// broker's meta keys.
func Apply(raw map[string]any, d admission.Decision, stamp string) {
	raw["Priority"] = d.Priority
	meta, _ := raw["Meta"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	meta[MetaTenant] = d.Tenant
	meta[MetaQueue] = d.Queue
	meta[MetaWorkload] = d.Workload
	meta[MetaBorrowed] = strconv.FormatBool(d.Outcome == admission.AdmitBorrowed)
	meta[MetaAdmission] = stamp
	raw["Meta"] = meta
}

// Stamper signs admissions, so that the broker can tell its own stamp from one a
// user wrote into the job meta.
type Stamper struct{ Key []byte }

// Stamp is "v1:<unix seconds>:<signature>" over what the admission decided.
func (s Stamper) Stamp(namespace, jobID string, d admission.Decision, at time.Time) string {
	ts := strconv.FormatInt(at.Unix(), 10)
	return "v1:" + ts + ":" + s.sign(namespace, jobID, d.Tenant, d.Queue, strconv.Itoa(d.Priority), ts)
}

// Verify reports whether job carries a stamp this broker made for its current
// namespace, id, tenant, queue and priority.
func (s Stamper) Verify(namespace string, job *api.Job) bool {
	parts := strings.SplitN(job.Meta[MetaAdmission], ":", 3)
	if len(parts) != 3 || parts[0] != "v1" || job.ID == nil || job.Priority == nil {
		return false
	}
	want := s.sign(namespace, *job.ID, job.Meta[MetaTenant], job.Meta[MetaQueue], strconv.Itoa(*job.Priority), parts[1])
	return hmac.Equal([]byte(parts[2]), []byte(want))
}

func (s Stamper) sign(fields ...string) string {
	mac := hmac.New(sha256.New, s.Key)
	fmt.Fprint(mac, strings.Join(fields, "\x00"))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}
