package consulkv

import (
	"context"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

// Stops keeps, under <prefix>stopped/<namespace>/<job>, the jobs the broker
// admitted that Nomad stopped (nomadjob.Stopped), with a copy every broker
// follows, so that verifying a job costs no round trip. The leader writes a
// record when it sees such a stop; a registration of the job through the
// broker deletes it; Prune is the keys' owner past the retention.
type Stops struct {
	r records[nomadjob.Stopped]
	m *mirror[nomadjob.Stopped]
}

// NewStops returns the records under prefix (e.g. "nomad-gpu/").
func NewStops(kv *consul.KV, prefix string, aside *Aside) *Stops {
	r := records[nomadjob.Stopped]{kv: kv, dir: prefix + "stopped/", what: "stopped job", kind: "stopped", aside: aside}
	return &Stops{r: r, m: &mirror[nomadjob.Stopped]{r: r}}
}

// Follow keeps the copy current until ctx ends.
func (s *Stops) Follow(ctx context.Context) { s.m.follow(ctx) }

// Stopped is the record of job namespace/job, if the copy has one.
func (s *Stops) Stopped(namespace, job string) (nomadjob.Stopped, bool) {
	return s.m.get(escape(namespace, job))
}

// Put writes a job's record, replacing the one before.
func (s *Stops) Put(ctx context.Context, namespace, job string, st nomadjob.Stopped) error {
	name := escape(namespace, job)
	if err := s.r.put(ctx, name, st); err != nil {
		return err
	}
	s.m.readBack(ctx, name)
	return nil
}

// Delete removes a job's record, whatever its version.
func (s *Stops) Delete(ctx context.Context, namespace, job string) error {
	name := escape(namespace, job)
	if _, err := s.r.kv.Delete(s.r.dir+name, (&consul.WriteOptions{}).WithContext(ctx)); err != nil {
		return err
	}
	s.m.removed(name)
	return nil
}

// Prune deletes the records written before before; it returns how many.
func (s *Stops) Prune(ctx context.Context, before time.Time) (int, error) {
	names, err := s.r.names(ctx)
	if err != nil {
		return 0, err
	}
	deleted := 0
	for name, index := range names {
		if st, ok := s.m.get(name); !ok || !st.At.Before(before) {
			continue // an old record only, as this broker's copy has it
		}
		if ok, err := s.r.remove(ctx, name, index); err != nil {
			return deleted, err
		} else if ok {
			s.m.removed(name)
			deleted++
		}
	}
	return deleted, nil
}
