package admission_test

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// rooms are nodes n1, n2, … of one device group, with free GPUs each.
func rooms(free ...int) []admission.NodeRoom {
	out := make([]admission.NodeRoom, len(free))
	for i, f := range free {
		out[i] = admission.NodeRoom{ID: "n" + string(rune('1'+i)), Group: h100, GPUs: 8, Free: f}
	}
	return out
}

// borrow puts borrowed allocations on room r.
func borrow(r *admission.NodeRoom, held ...admission.Held) {
	for _, h := range held {
		r.Held = append(r.Held, h)
		r.Borrowed += h.GPUs
	}
}

// Vision holds 12 of its 8 guaranteed (16 limit), 4 GPUs idle in all.
func TestBorrowedWorkIsAdmittedOnlyWhereANodeHasRoom(t *testing.T) {
	p := testPolicy(t, true)
	u := cluster(4, map[string]float64{"vision": 12})
	for _, c := range []struct {
		name    string
		free    []int
		j       *jobBuilder
		outcome admission.Outcome
		placed  []string
		reason  string
	}{
		{"idle GPUs spread over two nodes", []int{2, 2}, job("vision").gpus(1, 4), admission.Queue, nil,
			"no node has room for its allocations now (the most free GPUs on one node: 2 " + h100 + "); queued until a node has"},
		{"one node has room", []int{1, 3}, job("vision").gpus(1, 3), admission.AdmitBorrowed, []string{"n2"}, ""},
		{"best fit: the node left fullest", []int{4, 2, 3}, job("vision").gpus(1, 2), admission.AdmitBorrowed, []string{"n2"}, ""},
		{"every allocation on a node of its own when they do not share one", []int{2, 2}, job("vision").gpus(2, 2), admission.AdmitBorrowed, []string{"n1", "n2"}, ""},
		{"two allocations, one node for both", []int{4, 0}, job("vision").gpus(2, 2), admission.AdmitBorrowed, []string{"n1", "n1"}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			u.Nodes = rooms(c.free...)
			d := admission.Decide(p, c.j.Job, u)
			if d.Outcome != c.outcome || !slices.Equal(d.Placed["g"], c.placed) || !strings.Contains(d.Reason, c.reason) {
				t.Errorf("%s placed %v: %s, want %s placed %v (%q)", d.Outcome, d.Placed, d.Reason, c.outcome, c.placed, c.reason)
			}
			if d.Outcome == admission.Queue && (d.WaitsFor != admission.WaitCapacity || d.Rule != "") {
				t.Errorf("queued waiting for %q by rule %q: want capacity, no rule (its tenant's others may go on)", d.WaitsFor, d.Rule)
			}
		})
	}
	// Not known node by node (nil): decided on the idle GPUs, as before.
	u.Nodes = nil
	if d := admission.Decide(p, job("vision").gpus(1, 4).Job, u); d.Outcome != admission.AdmitBorrowed || d.Placed != nil {
		t.Errorf("without nodes: %s placed %v", d.Outcome, d.Placed)
	}
}

// Within its guarantee a job is admitted whether a node has room or not:
// Nomad preempts borrowed work for it. The broker places it where Nomad's
// victims (lowest priority group first, then largest) lose the least GPU
// time.
func TestGuaranteedWorkGoesWhereEvictionLosesLeast(t *testing.T) {
	p := testPolicy(t, true)
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	u := cluster(0, map[string]float64{"vision": 0})
	u.Now = now
	u.Nodes = rooms(0, 0, 0)
	// n1: one borrowed job of 4 GPUs running 10 h. n2: two of 2 GPUs for
	// 1 h and 3 h. n3: 4 GPUs at a higher sub-band for 1 h, 4 at the lowest
	// for 2 h (Nomad takes the lowest group: 8 GPU-hours).
	borrow(&u.Nodes[0], admission.Held{GPUs: 4, Priority: 20, Since: now.Add(-10 * time.Hour)}, admission.Held{GPUs: 4, Priority: 25, Since: now.Add(-10 * time.Hour)})
	borrow(&u.Nodes[1], admission.Held{GPUs: 2, Priority: 20, Since: now.Add(-time.Hour)}, admission.Held{GPUs: 2, Priority: 20, Since: now.Add(-3 * time.Hour)},
		admission.Held{GPUs: 4, Priority: 28, Since: now.Add(-20 * time.Hour)})
	borrow(&u.Nodes[2], admission.Held{GPUs: 4, Priority: 22, Since: now.Add(-time.Hour)}, admission.Held{GPUs: 4, Priority: 20, Since: now.Add(-2 * time.Hour)})
	d := admission.Decide(p, job("vision").gpus(1, 4).Job, u)
	// n1 loses 40 GPU-hours, n2 2×1 + 2×3 = 8, n3 8: a tie, fewest GPUs
	// evicted decides (4 each), then the first.
	if d.Outcome != admission.Admit || !slices.Equal(d.Placed["g"], []string{"n2"}) {
		t.Errorf("4 GPUs within the guarantee: %s placed %v, want admit on n2", d.Outcome, d.Placed)
	}
	d = admission.Decide(p, job("vision").gpus(1, 2).Job, u)
	if !slices.Equal(d.Placed["g"], []string{"n2"}) { // the 1-hour 2-GPU job: 2 GPU-hours
		t.Errorf("2 GPUs: placed %v, want n2", d.Placed)
	}
	// Free GPUs come first, whatever borrowed work elsewhere.
	u.Nodes[2].Free = 4
	if d := admission.Decide(p, job("vision").gpus(1, 4).Job, u); !slices.Equal(d.Placed["g"], []string{"n3"}) {
		t.Errorf("with 4 free on n3: placed %v, want n3", d.Placed)
	}
	// Nowhere to evict enough: admitted all the same, not pinned.
	u.Nodes = rooms(0, 0)
	if d := admission.Decide(p, job("vision").gpus(1, 4).Job, u); d.Outcome != admission.Admit || d.Placed != nil {
		t.Errorf("no room anywhere: %s placed %v, want admitted, Nomad to place it", d.Outcome, d.Placed)
	}
}

func TestPlacementModeNomadAndJobsTheBrokerDoesNotPin(t *testing.T) {
	p := testPolicy(t, true)
	u := cluster(8, nil)
	u.Nodes = rooms(8)
	if d := admission.Decide(p, job("vision").gpus(1, 2).Job, u); !slices.Equal(d.Placed["g"], []string{"n1"}) {
		t.Fatalf("placement mode broker (the default): placed %v", d.Placed)
	}
	j := job("vision").gpus(1, 2)
	j.Where.NoPin = true
	if d := admission.Decide(p, j.Job, u); d.Outcome != admission.Admit || d.Placed != nil {
		t.Errorf("a job the broker does not pin: %s placed %v", d.Outcome, d.Placed)
	}
	p.Placement.Mode = policy.PlaceNomad
	u = cluster(4, map[string]float64{"vision": 12})
	u.Nodes = rooms(2, 2)
	if d := admission.Decide(p, job("vision").gpus(1, 4).Job, u); d.Outcome != admission.Queue {
		t.Errorf("placement mode nomad still admits borrowed work only where a node has room: %s", d.Outcome)
	}
	u.Nodes = rooms(4, 2)
	if d := admission.Decide(p, job("vision").gpus(1, 4).Job, u); d.Outcome != admission.AdmitBorrowed || d.Placed != nil {
		t.Errorf("placement mode nomad: %s placed %v, want borrowed, not pinned", d.Outcome, d.Placed)
	}
}

// A node held for a waiting job takes no other borrowed work; the job it
// is held for may use it, and work within a guarantee when nothing else
// has room.
func TestANodeHeldForAWaitingJob(t *testing.T) {
	p := testPolicy(t, true)
	u := cluster(8, map[string]float64{"vision": 12})
	u.Nodes = rooms(6, 2)
	u.Nodes[0].ReservedFor = admission.JobKey("search", "big")
	if d := admission.Decide(p, job("vision").gpus(1, 4).Job, u); d.Outcome != admission.Queue {
		t.Errorf("borrowed work onto the held node: %s placed %v", d.Outcome, d.Placed)
	}
	if d := admission.Decide(p, job("vision").gpus(1, 2).Job, u); !slices.Equal(d.Placed["g"], []string{"n2"}) {
		t.Errorf("borrowed work beside it: %s placed %v, want n2", d.Outcome, d.Placed)
	}
	mine := job("vision").gpus(1, 4)
	mine.ID = "big"
	mine.Namespace = "vision"
	u.Nodes[0].ReservedFor = admission.JobKey("vision", "big")
	if d := admission.Decide(p, mine.Job, u); d.Outcome != admission.AdmitBorrowed || !slices.Equal(d.Placed["g"], []string{"n1"}) {
		t.Errorf("the job it is held for: %s placed %v, want n1", d.Outcome, d.Placed)
	}
	u = cluster(8, nil)
	u.Nodes = rooms(6, 0)
	u.Nodes[0].ReservedFor = admission.JobKey("search", "big")
	if d := admission.Decide(p, job("vision").gpus(1, 4).Job, u); d.Outcome != admission.Admit || !slices.Equal(d.Placed["g"], []string{"n1"}) {
		t.Errorf("within the guarantee, nothing else has room: %s placed %v, want n1", d.Outcome, d.Placed)
	}
}

func TestReserve(t *testing.T) {
	p := testPolicy(t, true)
	p.Placement.ReserveAfter = 6 * time.Hour
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	nodes := rooms(3, 5, 1, 5)
	big := admission.Waiting{Namespace: "vision", ID: "big", Tenant: "vision", Since: now.Add(-7 * time.Hour),
		Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 8}}}
	young := big
	young.ID, young.Since = "young", now.Add(-time.Hour)
	two := admission.Waiting{Namespace: "research", ID: "two", Tenant: "research", Since: now.Add(-8 * time.Hour),
		Groups: []admission.Group{{Name: "g", Count: 2, GPUsPerAlloc: 4}}}
	for _, c := range []struct {
		name   string
		oldest []admission.Waiting
		used   map[string]float64
		held   map[string]string
		want   map[string]string
	}{
		{"waited long enough, its tenant below its guarantee: the node with the most free", []admission.Waiting{big}, map[string]float64{"vision": 6}, nil,
			map[string]string{"n2": "vision/big"}},
		{"not long enough", []admission.Waiting{young}, map[string]float64{"vision": 6}, nil, map[string]string{}},
		{"its tenant at its guarantee", []admission.Waiting{big}, map[string]float64{"vision": 8}, nil, map[string]string{}},
		{"held before: the same node stays held", []admission.Waiting{big}, map[string]float64{"vision": 6}, map[string]string{"n4": "vision/big"},
			map[string]string{"n4": "vision/big"}},
		{"a node per allocation; one node for each job", []admission.Waiting{big, two}, map[string]float64{"vision": 6, "research": 0}, nil,
			map[string]string{"n2": "vision/big", "n4": "research/two", "n1": "research/two"}},
		{"a job gone: its node is free again", nil, nil, map[string]string{"n2": "vision/big"}, map[string]string{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := admission.Reserve(p, c.oldest, c.used, nodes, c.held, now); !maps.Equal(got, c.want) {
				t.Errorf("held %v, want %v", got, c.want)
			}
		})
	}
	// A job of another region is held a node of its own region only.
	west := slices.Clone(nodes)
	west[3].Region = "west"
	inWest := big
	inWest.Region = "west"
	if got := admission.Reserve(p, []admission.Waiting{big}, map[string]float64{"vision": 6}, west, nil, now); !maps.Equal(got, map[string]string{"n2": "vision/big"}) {
		t.Errorf("a job of the own region held %v, want n2", got)
	}
	if got := admission.Reserve(p, []admission.Waiting{inWest}, map[string]float64{"vision": 6}, west, nil, now); !maps.Equal(got, map[string]string{"n4": "vision/big"}) {
		t.Errorf("a job of region west held %v, want west's n4", got)
	}
	p.Placement.ReserveAfter = 0
	if got := admission.Reserve(p, []admission.Waiting{big}, map[string]float64{"vision": 6}, nodes, nil, now); len(got) != 0 {
		t.Errorf("reserve_after = 0 held %v", got)
	}
}

// FreeFor counts the free GPUs a job's allocations could take: of rooms that
// offer its model with room for its largest allocation, not held for
// another job.
func TestFreeForCountsWhatTheJobsAllocationsCouldTake(t *testing.T) {
	nodes := rooms(3, 1, 4, 2)
	nodes[2].ReservedFor = "vision/other"
	nodes = append(nodes, admission.NodeRoom{ID: "a1", Group: "NVIDIA A100-SXM4-80GB", GPUs: 8, Free: 8})
	job := admission.Job{ID: "train", Namespace: "vision", Groups: []admission.Group{
		{Name: "small", Count: 4, GPUsPerAlloc: 1, Model: h100}, {Name: "big", Count: 1, GPUsPerAlloc: 2, Model: h100}}}
	if got := admission.FreeFor(job, nodes); got != 3+2 {
		t.Errorf("FreeFor = %d, want 5: n1's 3 and n4's 2 (n2 has room for no 2-GPU allocation, n3 is held for another job, a1 is another model)", got)
	}
	job.Groups = []admission.Group{{Name: "any", Count: 1, GPUsPerAlloc: 1}}
	if got := admission.FreeFor(job, nodes); got != 3+1+2+8 {
		t.Errorf("any model, 1 GPU: FreeFor = %d, want 14", got)
	}
}
