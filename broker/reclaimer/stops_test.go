package reclaimer_test

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaimer"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

type stopRecords map[string]nomadjob.Stopped

func (s stopRecords) Get(job nomadjob.Ref) (nomadjob.Stopped, bool) { r, ok := s[job.ID]; return r, ok }
func (s stopRecords) Put(_ context.Context, job nomadjob.Ref, r nomadjob.Stopped) error {
	s[job.ID] = r
	return nil
}
func (s stopRecords) Delete(_ context.Context, job nomadjob.Ref) error {
	delete(s, job.ID)
	return nil
}

type writeRecords map[string]nomadjob.Registered

func (w writeRecords) Get(job nomadjob.Ref) (nomadjob.Registered, bool) {
	r, ok := w[job.ID]
	return r, ok
}

// A stop the view tells is recorded, unless the broker wrote the job again
// after it. A listing read before a revert through the broker, applied
// after it, tells the stop the revert revived the job from (TestGate's
// revert, in CI); recording it took the reverted job for unadmitted.
func TestTheStopRecorderRecordsNoStopTheBrokerRevivedFrom(t *testing.T) {
	view := cluster.NewView(func(*api.Job) bool { return true })
	stopped := func(id string, at uint64) *api.Job {
		j := testbuild.Job("vision", id).Group("g", 1, 1, "gpu").ModifyIndex(at).Stopped().Build()
		j.Meta = map[string]string{nomadjob.MetaAdmission: "v5:sig"}
		return j
	}
	view.ObserveJob(stopped("revived", 232))
	view.ObserveJob(stopped("stopped", 232))
	stops := stopRecords{}
	writes := writeRecords{"revived": {Index: 240}, "stopped": {Index: 200}}
	r := &reclaimer.StopRecorder{View: view, Records: stops, Writes: writes, Lock: view.LockJob}
	if err := r.Observed(context.Background(), time.Now(), nil, nil); err != nil {
		t.Fatal(err)
	}
	if s, ok := stops["stopped"]; !ok || s.Index != 232 {
		t.Errorf("a stop after the broker's last write: recorded %+v (%v), want at 232", s, ok)
	}
	if s, ok := stops["revived"]; ok {
		t.Errorf("a stop the broker's write at 240 revived the job from: recorded %+v", s)
	}
	if got := view.StoppedAdmitted(); len(got) != 0 {
		t.Errorf("stops the view still tells: %v", got)
	}
}
