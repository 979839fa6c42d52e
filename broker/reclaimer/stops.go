package reclaimer

import (
	"context"
	"errors"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/decide"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// StopRecorder records, on the leader, each job with the broker's stamp
// that Nomad stopped (nomadjob.Stopped): from then on a version of it
// registered straight in Nomad, its stamp copied, is not the broker's
// admission (decide.Check). A registration through the broker revives the
// job (decide.Revive).
type StopRecorder struct {
	View interface {
		StoppedAdmitted() map[[2]string]uint64
		RecordedStop(namespace, id string, index uint64)
		Registering(namespace, id string) bool
	}
	Records decide.StopRecords
	// Writes are the broker's own writes of jobs: one after a stop revived
	// the job (decide.Registering), so that stop is over, however late the
	// view tells it.
	Writes decide.Registrations
	// Region is the view's ("": the broker's own).
	Region string
	// Lock holds off the gate's and the queue's decisions on the job while
	// it is recorded: one of theirs in flight is the broker's own version.
	Lock func(namespace, id string) (unlock func())
}

// Observed implements Watcher.
func (s *StopRecorder) Observed(ctx context.Context, now time.Time, _ []reclaim.Alloc, _ map[string]reclaim.GPU) error {
	var errs []error
	for k, index := range s.View.StoppedAdmitted() {
		errs = append(errs, s.record(ctx, k[0], k[1], index, now))
	}
	return errors.Join(errs...)
}

func (s *StopRecorder) record(ctx context.Context, namespace, id string, index uint64, now time.Time) error {
	defer s.Lock(namespace, id)()
	if s.View.Registering(namespace, id) {
		return nil // the broker registers it again: the next pass looks
	}
	job := nomadjob.Ref{Region: s.Region, Namespace: namespace, ID: id}
	// A listing read before the broker registered the job again, applied
	// after, shows the stop it revived from, and so do its events, replayed.
	if w, ok := s.Writes.Get(job); ok && w.Index > index {
		s.View.RecordedStop(namespace, id, index)
		return nil
	}
	if r, ok := s.Records.Get(job); !ok || r.Index < index {
		if err := s.Records.Put(ctx, job, nomadjob.Stopped{Index: index, At: now.UTC()}); err != nil {
			return err
		}
	}
	s.View.RecordedStop(namespace, id, index)
	return nil
}
