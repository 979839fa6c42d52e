package proto_test

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	basepb "github.com/nomad-gpu/nomad-gpu/device-plugin/proto/base"
	devicepb "github.com/nomad-gpu/nomad-gpu/device-plugin/proto/device"
	hclspecpb "github.com/nomad-gpu/nomad-gpu/device-plugin/proto/hclspec"
	structspb "github.com/nomad-gpu/nomad-gpu/device-plugin/proto/structs"
)

// TestWireCompatibleWithNomad compares the descriptors compiled into the generated Go
// code with Nomad v1.6's own (testdata/nomad-v1.6.norm, produced from Nomad's .proto
// files by shared/protocheck): field numbers, names, labels, types and oneofs must match,
// or Nomad could not talk to the plugin.
func TestWireCompatibleWithNomad(t *testing.T) {
	want, err := os.ReadFile("testdata/nomad-v1.6.norm")
	if err != nil {
		t.Fatal(err)
	}
	files := []protoreflect.FileDescriptor{
		basepb.File_base_base_proto,
		devicepb.File_device_device_proto,
		hclspecpb.File_hclspec_hcl_spec_proto,
		structspb.File_structs_attribute_proto,
		structspb.File_structs_stats_proto,
		structspb.File_structs_recoverable_error_proto,
	}
	got := normalize(files)
	if got != string(want) {
		t.Errorf("generated descriptors differ from Nomad v1.6's protocol:\n%s", lineDiff(string(want), got))
	}
}

type block struct {
	kind, name, extra string
	body              []string
}

func normalize(files []protoreflect.FileDescriptor) string {
	var out []block
	for _, fd := range files {
		fp := protodesc.ToFileDescriptorProto(fd)
		pkg := "." + fp.GetPackage()
		out = messages(pkg, fp.GetMessageType(), out)
		for _, e := range fp.GetEnumType() {
			out = append(out, enumBlock(pkg+"."+e.GetName(), e))
		}
		for _, s := range fp.GetService() {
			b := block{kind: "service", name: pkg + "." + s.GetName()}
			for _, m := range s.GetMethod() {
				b.body = append(b.body, fmt.Sprintf("('%s', '%s', '%s', '%t', '%t')",
					m.GetName(), m.GetInputType(), m.GetOutputType(), m.GetClientStreaming(), m.GetServerStreaming()))
			}
			sort.Strings(b.body)
			out = append(out, b)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].kind != out[j].kind {
			return out[i].kind < out[j].kind
		}
		return out[i].name < out[j].name
	})
	var sb strings.Builder
	for _, b := range out {
		fmt.Fprintf(&sb, "%s %s %s\n", b.kind, b.name, b.extra)
		for _, l := range b.body {
			fmt.Fprintf(&sb, "    %s\n", l)
		}
	}
	return sb.String()
}

func messages(prefix string, ms []*descriptorpb.DescriptorProto, out []block) []block {
	for _, m := range ms {
		name := prefix + "." + m.GetName()
		b := block{kind: "message", name: name}
		if m.GetOptions().GetMapEntry() {
			b.extra = "map_entry"
		}
		fields := append([]*descriptorpb.FieldDescriptorProto(nil), m.GetField()...)
		sort.Slice(fields, func(i, j int) bool { return fields[i].GetNumber() < fields[j].GetNumber() })
		for _, f := range fields {
			oneof := ""
			if f.OneofIndex != nil {
				oneof = m.GetOneofDecl()[f.GetOneofIndex()].GetName()
			}
			if f.GetProto3Optional() {
				oneof = "(proto3 optional)"
			}
			b.body = append(b.body, fmt.Sprintf("(%d, '%s', '%s', '%s', '%s', '%s', '')",
				f.GetNumber(), f.GetName(), f.GetLabel(), f.GetType(), f.GetTypeName(), oneof))
		}
		out = append(out, b)
		out = messages(name, m.GetNestedType(), out)
		for _, e := range m.GetEnumType() {
			out = append(out, enumBlock(name+"."+e.GetName(), e))
		}
	}
	return out
}

func enumBlock(name string, e *descriptorpb.EnumDescriptorProto) block {
	b := block{kind: "enum", name: name}
	values := append([]*descriptorpb.EnumValueDescriptorProto(nil), e.GetValue()...)
	sort.Slice(values, func(i, j int) bool { return values[i].GetNumber() < values[j].GetNumber() })
	for _, v := range values {
		b.body = append(b.body, fmt.Sprintf("(%d, '%s')", v.GetNumber(), v.GetName()))
	}
	return b
}

// lineDiff lists the lines only one side has, enough to find a renumbered field.
func lineDiff(want, got string) string {
	count := map[string]int{}
	for _, l := range strings.Split(want, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(got, "\n") {
		count[l]--
	}
	var sb strings.Builder
	for l, n := range count {
		switch {
		case n > 0:
			fmt.Fprintf(&sb, "- %s\n", l)
		case n < 0:
			fmt.Fprintf(&sb, "+ %s\n", l)
		}
	}
	return sb.String()
}
