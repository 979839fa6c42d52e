package jsondoc_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/nomad-gpu/nomad-gpu/internal/jsondoc"
)

// FuzzParseReadsAsEncodingJSON: the document the broker cuts from a body
// is accepted only when encoding/json accepts the body, and its bytes read,
// with encoding/json, as the body itself does.
func FuzzParseReadsAsEncodingJSON(f *testing.F) {
	for _, s := range []string{`{"a":[1,2.5e3,"x\u0041\"",true,null,{}],"b":{"c":[]}}`, ` [ ] `, `{"k\u00e9y":"v","\ud800":1}`,
		"\"\xff\"", `{"a":1} {}`, `{"a":}`, ``, `{"a":1,"a":2}`} {
		f.Add([]byte(s))
	}
	read := func(b []byte) (any, error) {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		var v any
		err := dec.Decode(&v)
		return v, err
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		doc, err := jsondoc.Parse(body, &struct{}{})
		if err != nil {
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted what encoding/json refuses: %q", body)
		}
		want, err1 := read(body)
		got, err2 := read(doc.Bytes())
		if err1 != nil || err2 != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("%q reads as %v (%v), its document %q as %v (%v)", body, want, err1, doc.Bytes(), got, err2)
		}
	})
}
