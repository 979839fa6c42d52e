package consulkv

import (
	"context"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

// Stops keeps, under <prefix>stopped/<region>/<namespace>/<job>, the jobs
// the broker admitted that Nomad stopped (nomadjob.Stopped), with a copy
// every broker follows. The leader writes a record when it sees such a
// stop; a registration of the job through the broker deletes it; Prune is
// the keys' owner past the retention.
type Stops struct{ *JobRecords[nomadjob.Stopped] }

// NewStops returns the records under prefix (e.g. "nomad-gpu/") of the
// jobs of every region; home is the broker's own.
func NewStops(kv *consul.KV, prefix, home string, aside *Aside) Stops {
	r := records[nomadjob.Stopped]{kv: kv, dir: prefix + "stopped/", what: "stopped job", kind: "stopped", aside: aside}
	return Stops{newJobRecords(r, home)}
}

// Prune deletes the records written before before; it returns how many.
func (s Stops) Prune(ctx context.Context, before time.Time) (int, error) {
	return s.prune(ctx, func(name string) (bool, error) {
		st, ok := s.m.get(name)
		return ok && st.At.Before(before), nil // an old record only, as this broker's copy has it
	})
}
