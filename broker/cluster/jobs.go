package cluster

import (
	"iter"
	"maps"
	"sort"
	"strings"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

type jobKey struct{ namespace, id string }

// job is a live job's demand.
type job struct {
	groups   []admission.Group
	borrowed bool
	priority int
	// pinned are, for a batch job the broker placed (its stamp verified),
	// the node-id sets its GPU task groups are pinned to, by group.
	pinned        map[string][]string
	tenant, queue string // from a verified stamp, else ""
	parent        string // Nomad's ParentID: a dispatched or periodic child's parent job
	modifyIndex   uint64 // Nomad's JobModifyIndex of the version recorded
	version       uint64 // its Version
	demand        map[string]int
}

type byModel struct {
	held, borrowed map[string]int
}

// ObserveJob records a job's GPU demand while it is live (not stopped, not
// dead). An event about an older version than the one recorded is ignored.
func (v *View) ObserveJob(j *api.Job) {
	v.mu.Lock()
	v.observeJob(j)
	v.mu.Unlock()
	v.notify()
}

func (v *View) observeJob(j *api.Job) {
	if j.ID == nil {
		return
	}
	key := jobKey{nomadjob.Namespace(j), *j.ID}
	stopped, finished, live := ended(j)
	var modifyIndex uint64
	if j.JobModifyIndex != nil {
		modifyIndex = *j.JobModifyIndex
	}
	verified := v.verify(j)
	borrowed := j.Meta[nomadjob.MetaBorrowed] == "true" && verified
	if old, ok := v.jobs.live[key]; ok && modifyIndex < old.modifyIndex {
		return
	}
	// Any job carrying a stamp, verified here or not: one promoted, scaled
	// or dispatched verifies by its grant, which the view does not read.
	v.followStop(key, stopped || finished, live, j.Meta[nomadjob.MetaAdmission] != "", modifyIndex)
	// Nomad has already canonicalised the counts of a job it returns; a job
	// whose demand cannot be read is counted as nothing rather than guessed.
	a, _ := nomadjob.Admission(j, v.nodesFitting)
	v.remove(key)
	if !live {
		v.unplace(key) // nothing more of it will be placed
	}
	v.status.noteDispatched(key, j, live, verified, v.clock.Now())
	if how := nomadjob.UndeclaredGPUAccess(j); live && len(how) > 0 {
		v.jobs.undeclared[key] = strings.Join(how, "; ")
	}
	if j.Stable != nil && *j.Stable {
		v.jobs.setStable(key, a.Groups)
	} else if !stopped && nomadjob.AutoReverts(j) && len(v.jobs.stable[key]) > 0 {
		// A new version whose deployment may revert: counted at its stable
		// version from now, not from its deployment's first event, which
		// comes later (a queue pass in between would take those GPUs). The
		// deployment's end, or the next listing, settles it.
		v.jobs.reverting[key] = true
	}
	// A version that holds nothing (no GPUs, or every allocation failed:
	// Nomad calls the job dead) is kept while its stable one has GPUs: its
	// deployment may revert to them.
	groups := a.Groups
	if !live {
		groups = nil
	}
	if !stopped && (len(groups) > 0 || len(v.jobs.stable[key]) > 0) {
		jb := job{groups: groups, borrowed: borrowed, modifyIndex: modifyIndex}
		if j.Priority != nil {
			jb.priority = *j.Priority
		}
		if verified && j.Type != nil && *j.Type == api.JobTypeBatch {
			jb.pinned = nomadjob.GroupPins(j)
		}
		if j.Version != nil {
			jb.version = *j.Version
		}
		if j.ParentID != nil {
			jb.parent = *j.ParentID
		}
		if verified {
			jb.tenant, jb.queue = j.Meta[nomadjob.MetaTenant], j.Meta[nomadjob.MetaQueue]
		}
		v.add(key, jb)
	}
}

// ended reports whether Nomad stopped a job, whether it finished, and
// whether it is live (neither stopped nor dead). A batch job that finished
// is done with its admission, as a stopped one is: nothing of Nomad's own
// runs it again, no deployment reverts it.
func ended(j *api.Job) (stopped, finished, live bool) {
	stopped, live = j.Stop != nil && *j.Stop, nomadjob.Live(j)
	finished = !live && !stopped && j.Type != nil && (*j.Type == api.JobTypeBatch || *j.Type == api.JobTypeSysbatch)
	return stopped, finished, live
}

// followStop keeps the jobs with a stamp Nomad stopped (or, for batch work,
// that finished), for the leader to record (StoppedAdmitted). A version the
// broker registers again (its reservation, confirmed at this index or not
// yet) ends that; one registered straight in Nomad does not.
func (v *View) followStop(key jobKey, stopped, live, stamped bool, modifyIndex uint64) {
	switch {
	case stopped && stamped:
		v.stopped.saw(key, modifyIndex, v.clock.Now())
		// A registration Nomad took before the stop: its own event may
		// never show, as when a listing replaced the stream in between.
		v.reserved.stopped(key, modifyIndex)
	case live:
		if v.reserved.registers(key, modifyIndex) {
			v.stopped.revived(key)
		}
	}
}

// StoppedAdmitted are the jobs with the broker's stamp that Nomad stopped
// and the leader has not recorded yet, with the stop's JobModifyIndex.
func (v *View) StoppedAdmitted() map[[2]string]uint64 {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.stopped.pending()
}

// keepUnrecordedStops is, at a listing (snap), the stops not yet recorded
// that it keeps. It adds those of the jobs it lists as ended, and those of
// the jobs with the broker's stamp that the view had (was) and it lists no
// more: purged, at its index or before. A listing that replaced the event
// stream between a stop and its event, or its record, lost it.
func (v *View) keepUnrecordedStops(was map[jobKey]job, snap Snapshot) {
	now := v.clock.Now()
	v.stopped.prune(now)
	listed := make(map[jobKey]bool, len(snap.Jobs)+len(snap.Ended))
	for _, j := range snap.Jobs {
		if j.ID != nil {
			listed[jobKey{nomadjob.Namespace(j), *j.ID}] = true
		}
	}
	for _, j := range snap.Ended {
		if j.ID == nil || j.JobModifyIndex == nil {
			continue
		}
		key := jobKey{nomadjob.Namespace(j), *j.ID}
		listed[key] = true
		stopped, finished, live := ended(j)
		v.followStop(key, stopped || finished, live, j.Meta[nomadjob.MetaAdmission] != "", *j.JobModifyIndex)
	}
	for key, j := range was {
		if !listed[key] && j.tenant != "" {
			v.followStop(key, true, false, true, snap.Index)
		}
	}
}

// byNamespaceAndID is a copy of m keyed by [namespace, id], for callers
// outside the view.
func byNamespaceAndID[T any](m map[jobKey]T) map[[2]string]T {
	out := make(map[[2]string]T, len(m))
	for k, v := range m {
		out[[2]string{k.namespace, k.id}] = v
	}
	return out
}

// RecordedStop forgets a stop at index once the leader recorded it.
func (v *View) RecordedStop(namespace, id string, index uint64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.stopped.recorded(jobKey{namespace, id}, index)
}

// Registering reports whether the broker is registering the job: it holds a
// reservation Nomad's events have not shown yet, and that has not expired
// (expired ones are dropped only when usage is next read).
func (v *View) Registering(namespace, id string) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.reserved.live(jobKey{namespace, id}, v.clock.Now())
}

// observeStable records a job version Nomad marks stable (read from its
// versions, not its latest): what a failing deployment reverts to.
func (v *View) observeStable(j *api.Job) {
	if j.ID == nil || j.Stable == nil || !*j.Stable {
		return
	}
	a, _ := nomadjob.Admission(j, v.nodesFitting)
	v.jobs.setStable(jobKey{nomadjob.Namespace(j), *j.ID}, a.Groups)
}

// Revert is a revert Nomad made on its own: a deployment with auto_revert
// failed and Nomad registered the job's stable version again.
type Revert struct {
	// Region is the view's ("": the broker's own).
	Region, Namespace, JobID, Deployment string
	// Description is Nomad's, naming the version it went back to.
	Description string
	// Index is the deployment's ModifyIndex at its failure: Nomad registers
	// the stable version with that update, at that JobModifyIndex.
	Index uint64
}

// rolledBack reports the revert a deployment's update tells of.
func rolledBack(d *api.Deployment) (Revert, bool) {
	if d.Status != api.DeploymentStatusFailed || !strings.Contains(d.StatusDescription, "rolling back to job version") {
		return Revert{}, false
	}
	return Revert{Namespace: d.Namespace, JobID: d.JobID, Deployment: d.ID, Description: d.StatusDescription, Index: d.ModifyIndex}, true
}

// ObserveDeployment records the canaries an active, unpromoted deployment
// places beside the job's current allocations, and whether it reverts on
// failure. The job then counts its stable version too, until the
// deployment ends, or, when it failed and Nomad rolls back, until the
// rollback's own ends.
func (v *View) ObserveDeployment(d *api.Deployment) {
	v.mu.Lock()
	v.observeDeployment(d)
	v.mu.Unlock()
	v.notify()
}

func (v *View) observeDeployment(d *api.Deployment) {
	key := jobKey{d.Namespace, d.JobID}
	if old, ok := v.jobs.live[key]; ok && d.JobVersion < old.version {
		// A deployment of a version the job has moved on from (a late
		// update of its end, under load) says nothing of the one now:
		// it cleared the floor of the deployment running.
		return
	}
	canaries := map[string]int{}
	reverting := false
	switch d.Status {
	case api.DeploymentStatusSuccessful, api.DeploymentStatusFailed, api.DeploymentStatusCancelled:
		// A failed deployment that Nomad rolls back keeps the stable
		// version's floor until the rollback's own deployment ends. The
		// rollback version may come later, or dead with every allocation
		// failed, and count nothing meanwhile (N3: a queue pass in those
		// milliseconds took its GPUs).
		_, reverting = rolledBack(d)
	default:
		for tg, s := range d.TaskGroups {
			if s != nil && !s.Promoted && s.DesiredCanaries > 0 {
				canaries[tg] = s.DesiredCanaries
			}
			reverting = reverting || (s != nil && s.AutoRevert)
		}
	}
	old, ok := v.jobs.live[key]
	if ok {
		v.remove(key)
	}
	v.jobs.deployment(key, canaries, reverting)
	if ok {
		v.add(key, old)
	}
}

// ForgetJob drops a deregistered job.
func (v *View) ForgetJob(namespace, id string) {
	v.mu.Lock()
	v.forgetJob(namespace, id)
	v.mu.Unlock()
	v.notify()
}

// forgetPurged drops a job Nomad purged (or collected) at index. One with
// the broker's stamp is a stop, kept for the leader to record: its stored
// JSON registered again straight in Nomad is not the broker's admission.
func (v *View) forgetPurged(namespace, id string, index uint64) {
	key := jobKey{namespace, id}
	if j, ok := v.jobs.live[key]; ok && j.tenant != "" {
		v.followStop(key, true, false, true, index)
	}
	v.forgetJob(namespace, id)
}

func (v *View) forgetJob(namespace, id string) {
	key := jobKey{namespace, id}
	v.remove(key)
	v.jobs.forget(key)
	v.status.forget(key)
	v.unplace(key)
}

// add records a job and adds its demand (with its deployment's canaries, and
// no less than its stable version while its deployment may revert to it) to
// its namespace's totals.
func (v *View) add(key jobKey, j job) {
	j.demand = v.jobs.demand(key, j.groups)
	v.jobs.live[key] = j
	if len(v.holds.of(key)) > 0 {
		v.rooms = nil // its allocations' priority or borrowing may have changed
	}
	v.account(key.namespace, j, 1)
	v.reexcess(key)
	v.settle(key)
}

func (v *View) remove(key jobKey) {
	delete(v.jobs.undeclared, key)
	if old, ok := v.jobs.live[key]; ok {
		v.account(key.namespace, old, -1)
		delete(v.jobs.live, key)
		if len(v.holds.of(key)) > 0 {
			v.rooms = nil
		}
		v.reexcess(key)
	}
}

// reexcess recounts in the totals what a job's live allocations hold beyond
// its demand (all of it once the job is gone); it reports whether that changed.
func (v *View) reexcess(key jobKey) bool {
	old := v.excess[key]
	if old != nil {
		v.account(key.namespace, job{demand: old, borrowed: v.excessBorrowed[key]}, -1)
		delete(v.excess, key)
		delete(v.excessBorrowed, key)
	}
	held := v.holds.of(key)
	if len(held) == 0 {
		return old != nil
	}
	demand := v.jobs.live[key].demand
	over := 0
	for _, n := range held {
		over += n
	}
	for _, n := range demand {
		over -= n
	}
	if over <= 0 {
		return old != nil
	}
	models := make([]string, 0, len(held))
	for m := range held {
		models = append(models, m)
	}
	sort.Strings(models)
	ex := map[string]int{}
	// Models the demand names count against it first; the rest is excess.
	for _, m := range models {
		if take := min(over, max(0, held[m]-demand[m])); take > 0 {
			ex[m], over = take, over-take
		}
	}
	for _, m := range models {
		if take := min(over, held[m]-ex[m]); take > 0 {
			ex[m], over = ex[m]+take, over-take
		}
	}
	v.excess[key], v.excessBorrowed[key] = ex, v.jobs.live[key].borrowed
	v.account(key.namespace, job{demand: ex, borrowed: v.jobs.live[key].borrowed}, 1)
	return !maps.Equal(old, ex)
}

// account adds (sign 1) or removes (-1) a job's demand from its namespace's totals.
func (v *View) account(ns string, j job, sign int) {
	agg := v.held[ns]
	if agg == nil {
		agg = &byModel{held: map[string]int{}, borrowed: map[string]int{}}
		v.held[ns] = agg
	}
	for model, n := range j.demand {
		agg.held[model] += sign * n
		v.total[model] += sign * n
		if j.borrowed {
			agg.borrowed[model] += sign * n
		}
	}
}

// atLeast raises each model's GPUs in d to those in floor.
func atLeast(d, floor map[string]int) {
	for model, n := range floor {
		d[model] = max(d[model], n)
	}
}

// demandByModel is the devices a job's groups ask for, by model; a request
// for replicas of any model is under nomadjob.SharedSuffix alone.
func demandByModel(groups []admission.Group) map[string]int {
	out := map[string]int{}
	for _, g := range groups {
		model := g.Model
		if g.Shared && model == "" {
			model = nomadjob.SharedSuffix
		}
		out[model] += g.Count * g.GPUsPerAlloc
	}
	return out
}

// HasJob reports whether the view holds a live GPU job.
func (v *View) HasJob(namespace, id string) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	_, ok := v.jobs.live[jobKey{namespace, id}]
	return ok
}

// Knows reports whether the view has a live job of namespace whose id is
// id or, with prefix, starts with it, or one the broker dispatched to its
// region that ended within endedDispatchKept.
func (v *View) Knows(namespace, id string, prefix bool) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if !prefix {
		_, ok := v.jobs.live[jobKey{namespace, id}]
		return ok || v.status.endedLately(jobKey{namespace, id})
	}
	for _, keys := range []iter.Seq[jobKey]{maps.Keys(v.jobs.live), v.status.endedKeys()} {
		for k := range keys {
			if k.namespace == namespace && strings.HasPrefix(k.id, id) {
				return true
			}
		}
	}
	return false
}

// Running reports whether, as far as the view has seen, Nomad still runs
// the job: it is live, or an allocation of it still holds GPUs (Nomad's
// event for a stopped job may come before those for its allocations).
func (v *View) Running(namespace, id string) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.running(jobKey{namespace, id})
}

// running is Running; the caller holds v.mu.
func (v *View) running(key jobKey) bool {
	_, live := v.jobs.live[key]
	return live || len(v.holds.of(key)) > 0
}

// UndeclaredJobs are the live jobs that would use GPUs they do not ask for,
// by namespace and id, with how (nomadjob.UndeclaredGPUAccess): they hold
// no GPU in Nomad's accounting, so GPUAllocs does not show them.
func (v *View) UndeclaredJobs() map[[2]string]string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return byNamespaceAndID(v.jobs.undeclared)
}
