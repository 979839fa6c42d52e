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
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// Meta keys the broker writes on admitted jobs.
const (
	MetaTenant    = "nomad-gpu.tenant"
	MetaQueue     = "nomad-gpu.queue"
	MetaWorkload  = "nomad-gpu.workload"
	MetaBorrowed  = "nomad-gpu.borrowed"
	MetaAdmission = "nomad-gpu.admission"
	// MetaTTL is the lifetime a job asks for; the user's, not the broker's.
	MetaTTL = "nomad-gpu.ttl"
	// MetaRegion = RegionAuto leaves the job's region to the broker (the
	// user's); MetaDispatched is the region the broker chose for it.
	MetaRegion     = "nomad-gpu.region"
	MetaDispatched = "nomad-gpu.dispatched-region"
	// MetaDispatchID names one dispatch of the job: of two copies of a job
	// in two regions (one requeued from a region lost, which came back),
	// the one with the earlier id is stale. Ids sort by the time of their
	// dispatch.
	MetaDispatchID = "nomad-gpu.dispatch-id"
)

// RegionAuto is MetaRegion's one value.
const RegionAuto = policy.RegionAuto

// DefaultNamespace is Nomad's namespace when a job names none.
const DefaultNamespace = "default"

// Namespace is the namespace of a job as Nomad returns it.
func Namespace(job *api.Job) string {
	return ResolveNamespace("", "", deref(job.Namespace))
}

// Admission is a job Nomad runs, as admission sees it: Nomad has already
// filled in its counts; system jobs count one allocation per fitting node; a
// parameterized or periodic parent places nothing itself (its children are
// jobs of their own).
func Admission(job *api.Job, nodesFitting func(string, int) int) (admission.Job, error) {
	if IsParent(job) {
		return admission.Job{ID: deref(job.ID), Namespace: Namespace(job)}, nil
	}
	groups, err := Groups(job, Placement{NodesFitting: nodesFitting})
	return AdmissionJob(job, Namespace(job), groups), err
}

// AdmissionJob is job, in namespace, with groups its GPU demand, as
// admission sees it: the one place its fields are read from a job.
func AdmissionJob(job *api.Job, namespace string, groups []admission.Group) admission.Job {
	return admission.Job{ID: deref(job.ID), Namespace: namespace, Queue: job.Meta[MetaQueue], TTL: job.Meta[MetaTTL], Groups: groups,
		CanaryAutoRevert: CanaryAutoRevert(job), Where: where(job), Periodic: job.IsPeriodic()}
}

// Dead reports whether Nomad's status for a job version that is not
// stopped says its work is over. Nomad stores a registration in two steps
// at one index: the job, its status read from what ran before ("dead" once
// anything ran), then its evaluation, which makes it pending. Readers see
// the first step too; a version dead at the index it was registered at
// (ModifyIndex, JobModifyIndex: those of a job or of a list stub) has not
// run yet.
func Dead(status string, modifyIndex, jobModifyIndex uint64) bool {
	return status == "dead" && modifyIndex != jobModifyIndex
}

// Live reports whether Nomad runs the job as it stands, or will: not
// stopped, and not dead (Dead; an index it lacks reads as 0). The listing
// keeps such jobs, and the view counts them.
func Live(j *api.Job) bool {
	if j.Stop != nil && *j.Stop {
		return false
	}
	var modifyIndex, jobModifyIndex uint64
	if j.ModifyIndex != nil {
		modifyIndex = *j.ModifyIndex
	}
	if j.JobModifyIndex != nil {
		jobModifyIndex = *j.JobModifyIndex
	}
	return j.Status == nil || !Dead(*j.Status, modifyIndex, jobModifyIndex)
}

// IsParent reports whether a job only launches other jobs: parameterized
// (each dispatch is a job) or periodic (each launch is a job).
func IsParent(job *api.Job) bool { return job.IsParameterized() || job.IsPeriodic() }

// BrokerMeta is the meta an admission writes.
func BrokerMeta(d admission.Decision, stamp string) map[string]string {
	return map[string]string{MetaTenant: d.Tenant, MetaQueue: d.Queue, MetaWorkload: d.Workload,
		MetaBorrowed: strconv.FormatBool(d.Outcome == admission.AdmitBorrowed), MetaAdmission: stamp}
}

// Stamper signs admissions, so that the broker can tell its own stamp from one a
// user wrote into the job meta, or copied from another job. Region is the
// broker's own region as Nomad names it: a job naming none, or "global",
// is stored by Nomad in that region.
type Stamper struct {
	Key    []byte
	Region string
}

// Stamp is "v5:<signature>" over what the admission decided. It signs the
// namespace, job id, type and region, tenant, queue, priority, borrowed, and
// each GPU task group's name, model, GPUs per allocation, count and node pin
// (PinNodes), and the job's nomad-gpu.ttl if it has one. It has no time in
// it, so that registering the same job again changes nothing in Nomad.
func (s Stamper) Stamp(namespace string, job *api.Job, d admission.Decision) string {
	return stampV5 + s.sign(namespace, job, deref(job.ID), d.Tenant, d.Queue, d.Priority, strconv.FormatBool(d.Outcome == admission.AdmitBorrowed), nil, pinsAllWhere)
}

// Stamp versions. v5 signs v4's fields and the job's type and region: a
// batch job's stamp on a sysbatch job, or an east job's registered in
// west, is not the broker's admission. v4 signs the node pins of every GPU
// task group pinned (placement mode broker pins any job); v3 a system
// job's only; v2 none. Older stamps still verify: their job was pinned as
// it was admitted. A copy of one on a job without the pin is caught only
// once the job is registered through the broker again.
const (
	stampV5 = "v5:"
	stampV4 = "v4:"
	stampV3 = "v3:"
	stampV2 = "v2:"
)

// pinSigning is which node pins a stamp signs.
type pinSigning int

const (
	pinsNone     pinSigning = iota // v2
	pinsSystem                     // v3: a system or sysbatch job's
	pinsAll                        // v4: any GPU task group's that has one
	pinsAllWhere                   // v5: v4's, and the job's type and region
)

// stampOf is a job's stamp: its signature, and which pins it signs.
func stampOf(job *api.Job) (sig string, pins pinSigning, ok bool) {
	stamp := job.Meta[MetaAdmission]
	if sig, ok := strings.CutPrefix(stamp, stampV5); ok {
		return sig, pinsAllWhere, true
	}
	if sig, ok := strings.CutPrefix(stamp, stampV4); ok {
		return sig, pinsAll, true
	}
	if sig, ok := strings.CutPrefix(stamp, stampV3); ok {
		return sig, pinsSystem, true
	}
	sig, ok = strings.CutPrefix(stamp, stampV2)
	return sig, pinsNone, ok
}

// Verify reports whether a job (as Nomad returns it) carries a stamp this
// broker made for its current namespace, id, priority, meta and GPU demand.
func (s Stamper) Verify(job *api.Job) bool {
	sig, pins, ok := stampOf(job)
	if !ok || job.ID == nil || job.Priority == nil {
		return false
	}
	return s.verify(job, deref(job.ID), sig, *job.Priority, nil, pins)
}

// VerifyCounting is Verify for the cluster view, which counts each job's GPUs
// without reading grants. It also takes a borrowed job that runs up to
// policy.GuaranteedSpread above the priority its stamp was made for, where
// the broker moves borrowed work between sub-bands (borrowing.sub_bands).
// Such a job is still counted borrowed; the reclaim rules check its grant.
func (s Stamper) VerifyCounting(job *api.Job) bool {
	if s.Verify(job) {
		return true
	}
	sig, pins, ok := stampOf(job)
	if !ok || job.Meta[MetaBorrowed] != "true" || job.ID == nil || job.Priority == nil {
		return false
	}
	for k := 1; k <= policy.GuaranteedSpread; k++ {
		if s.verify(job, deref(job.ID), sig, *job.Priority-k, nil, pins) {
			return true
		}
	}
	return false
}

// ScaleGrant is what the broker admitted for a job scaled through it: a scale
// changes counts, not meta, so the stamp made for the Stamped counts holds
// while the job runs the Admitted ones (GPU task groups by name).
type ScaleGrant struct {
	Stamp    string         `json:"stamp"`
	Stamped  map[string]int `json:"stamped"`
	Admitted map[string]int `json:"admitted"`
	// Parent is, for a child dispatched through the broker, the
	// parameterized job it was dispatched from: the child carries its
	// parent's stamp, made for the parent's id.
	Parent string `json:"parent,omitempty"`
	// StampedPriority is, for a job the broker promoted in place from
	// borrowed (borrowing.promote_below), the priority its stamp was made
	// for. A priority change keeps Nomad's allocations and a meta change
	// would replace them, so the stamp stays and the grant says what changed.
	StampedPriority int `json:"stamped_priority,omitempty"`
	// Priority is the priority the broker registers such a job at, From
	// the one it ran at before: it verifies at those two only, since the
	// grant is written before the job, which may fail to register.
	// Priority 0 verifies at any (a grant written before these were
	// recorded).
	Priority int `json:"priority,omitempty"`
	From     int `json:"from_priority,omitempty"`
	// SubBand: the job runs on borrowed, moved to a sub-band of the
	// borrowing priority (borrowing.sub_bands), not promoted.
	SubBand bool `json:"sub_band,omitempty"`
}

// Stopped records that Nomad stopped, at its JobModifyIndex Index, a job
// the broker admitted. Its stamp (and grants) no longer stand for a version
// registered after that, unless the broker registered it (Pending while it
// does, the record deleted once Nomad took it). A stamp says "admitted",
// not "admitted for this run": without it, the stopped job registered again
// straight in Nomad verified as the broker's.
type Stopped struct {
	Index   uint64    `json:"stopped_at_index"`
	Pending bool      `json:"pending,omitempty"`
	At      time.Time `json:"recorded_at"`
}

// Registered records the JobModifyIndex at which the broker's own last
// write of a job that makes a new version of it (a registration, a revert,
// a scale, a rollback Nomad made of a deployment the broker let fail) took
// effect. A stamp is made before Nomad has the job and cannot name that
// index, and this record binds it. A version the broker did not write (a
// revert, scale or stable straight in Nomad, back to what a stamp or grant
// covers) is not its admission. Pending while a write is in flight: any
// version from Index on is the broker's until it is settled.
type Registered struct {
	Index   uint64    `json:"job_modify_index"`
	Pending bool      `json:"pending,omitempty"`
	At      time.Time `json:"recorded_at"`
}

// Ref names a job where Nomad keeps it. The broker's records of a job are
// keyed by it: two regions each keep their own job of one id, and the
// indexes of two regions' Nomads do not compare. Region "" (or "global")
// is the broker's home region.
type Ref struct{ Region, Namespace, ID string }

// RefOf is the Ref of a job as Nomad returns it.
func RefOf(job *api.Job) Ref {
	return Ref{Region: deref(job.Region), Namespace: Namespace(job), ID: deref(job.ID)}
}

// In is r in region (its own one, when region is "").
func (r Ref) In(region string) Ref {
	if region != "" {
		r.Region = region
	}
	return r
}

// Promoted reports whether job runs promoted under g: at another priority
// than its (borrowed) stamp was made for, and not in a sub-band.
func (g ScaleGrant) Promoted(job *api.Job) bool {
	return g.StampedPriority != 0 && !g.SubBand && job.Priority != nil && *job.Priority != g.StampedPriority
}

// VerifyScaled is Verify for a job scaled through the broker under g.
func (s Stamper) VerifyScaled(job *api.Job, g ScaleGrant) bool {
	sig, pins, ok := stampOf(job)
	if !ok || job.ID == nil || job.Priority == nil || job.Meta[MetaAdmission] != g.Stamp {
		return false
	}
	id := deref(job.ID)
	if g.Parent != "" {
		if deref(job.ParentID) != g.Parent || !job.Dispatched {
			return false
		}
		id = g.Parent
	}
	counts := GPUGroupCounts(job)
	if len(counts) != len(g.Admitted) {
		return false
	}
	for name, c := range counts {
		if a, ok := g.Admitted[name]; !ok || a != c {
			return false // scaled past the broker since
		}
	}
	priority := *job.Priority
	if g.StampedPriority != 0 {
		if g.Priority != 0 && priority != g.Priority && priority != g.From {
			return false // its priority changed past the broker since
		}
		priority = g.StampedPriority
	}
	return s.verify(job, id, sig, priority, g.Stamped, pins)
}

// GPUGroupCounts are the counts of a job's GPU task groups, by name.
func GPUGroupCounts(job *api.Job) map[string]int {
	out := map[string]int{}
	for _, tg := range job.TaskGroups {
		if tg == nil {
			continue
		}
		perModel, err := gpusPerAlloc(tg)
		if c, err2 := groupCount(tg); err == nil && err2 == nil && len(perModel) > 0 {
			out[deref(tg.Name)] = c
		}
	}
	return out
}

// jobType is a job's type as Nomad stores it (service when none).
func jobType(job *api.Job) string {
	if t := deref(job.Type); t != "" {
		return t
	}
	return api.JobTypeService
}

// regionOf is the region Nomad stores job in: its own, unless it names
// none or "global" (Nomad's regionForJob), then the broker's.
func (s Stamper) regionOf(job *api.Job) string {
	if r := deref(job.Region); r != "" && r != api.GlobalRegion {
		return r
	}
	return s.Region
}

// verify checks sig over the job as job id at priority, with counts (when
// given) in place of the job's own for the groups they name, and its pins.
func (s Stamper) verify(job *api.Job, id, sig string, priority int, counts map[string]int, pins pinSigning) bool {
	want := s.sign(Namespace(job), job, id, job.Meta[MetaTenant], job.Meta[MetaQueue], priority, job.Meta[MetaBorrowed], counts, pins)
	return want != "" && hmac.Equal([]byte(sig), []byte(want))
}

// sign is the signature over every field a stamp binds, in one fixed order.
func (s Stamper) sign(namespace string, job *api.Job, id, tenant, queue string, priority int, borrowed string, counts map[string]int, pins pinSigning) string {
	mac := hmac.New(sha256.New, s.Key)
	fields := []string{namespace, id, tenant, queue, strconv.Itoa(priority), borrowed}
	for _, tg := range job.TaskGroups {
		if tg == nil {
			continue
		}
		perModel, err := gpusPerAlloc(tg)
		count, err2 := groupCount(tg)
		if c, ok := counts[deref(tg.Name)]; ok {
			count = c
		}
		if err != nil || err2 != nil {
			return "" // never admitted: nothing verifies
		}
		for _, m := range perModel {
			fields = append(fields, fmt.Sprintf("%s\x01%s\x01%d\x01%d", deref(tg.Name), m.model, m.gpus, count))
		}
		if len(perModel) > 0 && (pins == pinsSystem && isSystem(job) || pins >= pinsAll && (isSystem(job) || pinned(job, tg))) {
			// The nodes it may run on: the same system job without its pin
			// would grow onto every node that joins, and a job the broker
			// placed would run where admission did not count it.
			fields = append(fields, "\x02pin\x01"+deref(tg.Name)+"\x01"+pinsOf(job, tg))
		}
	}
	if ttl := job.Meta[MetaTTL]; ttl != "" {
		// The lifetime admission allowed: one written into Nomad later is
		// not. (Absent, nothing is added: stamps made before it still verify.)
		fields = append(fields, "\x02ttl\x01"+ttl)
	}
	if pins >= pinsAllWhere {
		fields = append(fields, "\x02type\x01"+jobType(job), "\x02region\x01"+s.regionOf(job))
	}
	for _, f := range fields {
		fmt.Fprintf(mac, "%d:%s", len(f), f) // length-prefixed: no two field lists sign alike
	}
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}
