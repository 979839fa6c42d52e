package consulkv

import (
	"context"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

// Registrations keeps, under <prefix>registered/<region>/<namespace>/<job>,
// the JobModifyIndex of the broker's own last write of each job it admitted
// (nomadjob.Registered), with a copy every broker follows. Prune is the
// keys' owner: the leader deletes those of jobs Nomad no longer has.
type Registrations struct {
	*JobRecords[nomadjob.Registered]
}

// NewRegistrations returns the records under prefix (e.g. "nomad-gpu/") of
// the jobs of every region; home is the broker's own.
func NewRegistrations(kv *consul.KV, prefix, home string, aside *Aside) Registrations {
	r := records[nomadjob.Registered]{kv: kv, dir: prefix + "registered/", what: "registration", kind: "registered", aside: aside}
	return Registrations{newJobRecords(r, home)}
}

// Prune deletes the records of the jobs gone says Nomad no longer has (a
// region "": any region governed), and a key no record could be under; it
// returns how many it deleted. One whose job cannot be looked up stays.
func (s Registrations) Prune(ctx context.Context, gone func(ctx context.Context, job nomadjob.Ref) (bool, error)) (int, error) {
	return s.prune(ctx, s.b.jobGone(ctx, gone))
}
