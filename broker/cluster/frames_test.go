package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// frameStream is two frames and a heartbeat as Nomad writes them: an
// allocation event carrying its job, whose strings hold what looks like
// JSON ("Job":{, braces, escaped quotes and backslashes), a job event, a
// node event, and blank lines.
func frameStream(t testing.TB) []byte {
	j := testbuild.Job("ns0", `tricky "Job":{"x":[1,2]} \" \\`).Group("g", 1, 1, "nvidia/gpu").Meta("note", `}]"Allocation":{"Job":`).Build()
	a := testbuild.Alloc("a1", "ns0", *j.ID, "n1", 7, "n1-0").Build()
	a.Job = j
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	for _, f := range []map[string]any{
		{"Index": 7, "Events": []map[string]any{
			{"Topic": api.TopicAllocation, "Type": "AllocationUpdated", "Index": 7, "Payload": map[string]any{"Allocation": a}},
			{"Topic": api.TopicJob, "Type": "JobRegistered", "Index": 7, "Payload": map[string]any{"Job": j}},
		}},
		{},
		{"Index": 8, "Events": []map[string]any{
			{"Topic": api.TopicNode, "Type": "NodeRegistration", "Index": 8, "Payload": map[string]any{"Node": testbuild.Node("n1", testbuild.H100, 8, 0)}},
		}},
	} {
		if err := enc.Encode(f); err != nil {
			t.Fatal(err)
		}
		out.WriteString("\n")
	}
	return out.Bytes()
}

// Frames decode what json.Decoder decodes, frame by frame, with no
// allocation's job read: the cut leaves the job of a job event alone.
func TestFramesDecodeAsTheStreamReadsLessTheAllocationsJob(t *testing.T) {
	stream := frameStream(t)
	want := json.NewDecoder(bytes.NewReader(stream))
	got := NewFrames(bytes.NewReader(stream))
	for n := 0; ; n++ {
		var w, g Events
		werr, gerr := want.Decode(&w), got.Next(&g)
		if werr == io.EOF && gerr == io.EOF {
			if n != 3 {
				t.Errorf("%d frames, want 3", n)
			}
			break
		}
		if werr != nil || gerr != nil {
			t.Fatalf("frame %d: %v, want %v", n, gerr, werr)
		}
		if !reflect.DeepEqual(w, g) {
			t.Errorf("frame %d decodes as\n%+v\nwant\n%+v", n, g, w)
		}
	}
	cut := cutAllocationJobs(nil, bytes.SplitN(stream, []byte("\n"), 2)[0])
	if n := bytes.Count(cut, []byte(`"ID":"tricky`)); n != 1 {
		t.Errorf("the job's id appears %d times in the cut frame, want once (the job event's):\n%s", n, cut)
	}
	if !bytes.Contains(cut, []byte(`"Job":null`)) {
		t.Errorf("the allocation's job is not cut:\n%s", cut)
	}
}

// A frame cut short or broken is an error, never a frame decoded in part.
func TestABrokenFrameIsAnError(t *testing.T) {
	stream := frameStream(t)
	first := bytes.SplitN(stream, []byte("\n"), 2)[0]
	for name, b := range map[string][]byte{
		"cut short":        first[:len(first)/2],
		"an unended value": append(append([]byte{}, first[:len(first)/2]...), '\n'),
		"closed twice":     []byte(`{"Index":1}}` + "\n"),
	} {
		var f Events
		if err := NewFrames(bytes.NewReader(b)).Next(&f); err == nil || errors.Is(err, io.EOF) {
			t.Errorf("%s: %v, want an error", name, err)
		}
	}
}

// Whatever the bytes, the cut frame decodes as the frame does, or the
// frame itself does not decode.
func FuzzCutAllocationJobs(f *testing.F) {
	for _, line := range bytes.Split(frameStream(f), []byte("\n")) {
		f.Add(line)
	}
	f.Add([]byte(`{"Events":[{"Payload":{"Allocation":{"Job":"x","ID":"a"}}}]}`))
	f.Add([]byte(`{"Events":[{"Payload":{"Allocation":{"ID":"a","Job" : [ {"a":"\\\""} ] }}}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var want, got Events
		if json.Unmarshal(b, &want) != nil {
			return
		}
		cut := cutAllocationJobs(nil, b)
		if err := json.Unmarshal(cut, &got); err != nil {
			t.Fatalf("%s\ncut to\n%s\n: %v", b, cut, err)
		}
		if !reflect.DeepEqual(want, got) {
			t.Errorf("%s decodes as %+v, cut as %+v", b, want, got)
		}
	})
}
