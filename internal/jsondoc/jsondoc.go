// Package jsondoc reads a JSON request body losslessly, as Nomad will read it:
// a document in the order it was sent. One that could be read two ways (a
// key given twice, in any spelling encoding/json folds together) is refused.
// The keys of a target type's fields are rewritten to their canonical
// spelling, and every other key is kept as sent. The broker forwards the
// document it read, so that what Nomad acts on is what the broker decided on.
package jsondoc

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// Nomad reads request bodies with encoding/json into its api structs: keys match
// fields case-insensitively, a repeated key overwrites (or merges into) what came
// before, and keys it does not know are dropped. The broker reads the same body
// into the same structs, but first refuses what could be read two ways (a field
// spelled twice). It rewrites every known key to its canonical spelling, so the
// document it forwards can only be read as the job it decided on. Keys it
// does not know (fields of newer Nomad versions) are kept as sent.

// MaxDepth bounds the nesting of a request body.
const MaxDepth = 64

// Doc is a JSON document read in order, with canonical keys wherever the
// target type names the field.
type Doc struct{ root *Node }

// Node is one JSON value: an object, an array, or a scalar kept as JSON text.
type Node struct {
	members []member // object
	elems   []*Node  // array
	raw     []byte   // scalar (string, number, true, false, null)
	object  bool
	array   bool
}

type member struct {
	key string
	val *Node
}

// Parse reads body as a document for the Go type of target (a pointer to a
// struct, e.g. *api.JobRegisterRequest): it refuses trailing data, nesting
// deeper than MaxDepth and any key given twice, and canonicalises the keys of
// target's fields. It then reads the document into target the way Nomad
// reads it.
func Parse(body []byte, target any) (*Doc, error) {
	// encoding/json checks the syntax as it decodes: the body is read into
	// target first, and the tree is then cut from bytes known to be valid.
	err := json.Unmarshal(body, target)
	if _, bad := err.(*json.SyntaxError); bad {
		return nil, fmt.Errorf("malformed JSON in request body: %w", syntaxError(body))
	}
	r := reader{data: body}
	root, rerr := r.value(0)
	if rerr != nil {
		return nil, fmt.Errorf("malformed JSON in request body: %w", rerr)
	}
	renamed := false
	var path []string
	if err := canonicalize(root, reflect.TypeOf(target), &path, &renamed); err != nil {
		return nil, err
	}
	doc := &Doc{root: root}
	if renamed {
		// Read again as Nomad will read the document forwarded.
		reflect.ValueOf(target).Elem().SetZero()
		err = json.Unmarshal(doc.Bytes(), target)
	} // else the body is the document: every key as its field spells it, none twice
	if err != nil {
		return nil, fmt.Errorf("malformed request: %w", err)
	}
	return doc, nil
}

// Root is the document's top-level value.
func (d *Doc) Root() *Node { return d.root }

// Bytes encodes the document.
func (d *Doc) Bytes() []byte {
	var b bytes.Buffer
	d.root.encode(&b)
	return b.Bytes()
}

// readDoc reads one JSON value. encoding/json checks the syntax first (it is
// what Nomad reads with); the tree is then cut from the bytes as they are:
// scalars keep their text, which encoding/json reads as it read the original.
func readDoc(data []byte) (*Node, error) {
	if !json.Valid(data) {
		return nil, syntaxError(data)
	}
	r := reader{data: data}
	return r.value(0)
}

// syntaxError says what is wrong with data, which json.Valid refused.
func syntaxError(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var v json.RawMessage
	switch err := dec.Decode(&v); {
	case err == io.EOF:
		return errors.New("empty body")
	case err != nil:
		return err
	}
	return errors.New("data after the JSON object")
}

// reader walks valid JSON.
type reader struct {
	data []byte
	i    int
}

func (r *reader) space() {
	for r.i < len(r.data) {
		switch r.data[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

func (r *reader) value(depth int) (*Node, error) {
	if depth > MaxDepth {
		return nil, fmt.Errorf("nested deeper than %d levels", MaxDepth)
	}
	r.space()
	switch r.data[r.i] {
	case '{':
		r.i++
		n := &Node{object: true}
		for r.space(); r.data[r.i] != '}'; r.space() {
			if r.data[r.i] == ',' {
				r.i++
				r.space()
			}
			key, err := r.key()
			if err != nil {
				return nil, err
			}
			r.space()
			r.i++ // ':'
			v, err := r.value(depth + 1)
			if err != nil {
				return nil, err
			}
			n.members = append(n.members, member{key: key, val: v})
		}
		r.i++
		return n, nil
	case '[':
		r.i++
		n := &Node{array: true}
		for r.space(); r.data[r.i] != ']'; r.space() {
			if r.data[r.i] == ',' {
				r.i++
			}
			v, err := r.value(depth + 1)
			if err != nil {
				return nil, err
			}
			n.elems = append(n.elems, v)
		}
		r.i++
		return n, nil
	}
	return &Node{raw: r.scalar()}, nil
}

// scalar is the text of the string, number, true, false or null at r.i.
func (r *reader) scalar() []byte {
	start := r.i
	if r.data[r.i] == '"' {
		for r.i++; r.data[r.i] != '"'; r.i++ {
			if r.data[r.i] == '\\' {
				r.i++
			}
		}
		r.i++
		return r.data[start:r.i]
	}
	for r.i < len(r.data) {
		switch r.data[r.i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return r.data[start:r.i]
		}
		r.i++
	}
	return r.data[start:r.i]
}

// key is an object key as encoding/json reads it: escapes decoded, invalid
// UTF-8 replaced.
func (r *reader) key() (string, error) {
	raw := r.scalar()
	plain := true
	for _, c := range raw[1 : len(raw)-1] {
		if c == '\\' || c >= utf8.RuneSelf {
			plain = false
			break
		}
	}
	if plain {
		return string(raw[1 : len(raw)-1]), nil
	}
	var key string
	err := json.Unmarshal(raw, &key)
	return key, err
}

func (n *Node) encode(b *bytes.Buffer) {
	switch {
	case n.object:
		b.WriteByte('{')
		for i, m := range n.members {
			if i > 0 {
				b.WriteByte(',')
			}
			writeKey(b, m.key)
			b.WriteByte(':')
			m.val.encode(b)
		}
		b.WriteByte('}')
	case n.array:
		b.WriteByte('[')
		for i, e := range n.elems {
			if i > 0 {
				b.WriteByte(',')
			}
			e.encode(b)
		}
		b.WriteByte(']')
	default:
		b.Write(n.raw)
	}
}

// writeKey writes key as a JSON string: as it is when nothing in it needs
// escaping (as good as every key), else as encoding/json writes it.
func writeKey(b *bytes.Buffer, key string) {
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' || c >= utf8.RuneSelf {
			k, _ := json.Marshal(key)
			b.Write(k)
			return
		}
	}
	b.Grow(len(key) + 2)
	b.WriteByte('"')
	b.WriteString(key)
	b.WriteByte('"')
}

// Bytes encodes the node.
func (n *Node) Bytes() []byte {
	var b bytes.Buffer
	n.encode(&b)
	return b.Bytes()
}

// Get returns an object's member by its (canonical) key, or nil.
func (n *Node) Get(key string) *Node {
	if n == nil {
		return nil
	}
	for _, m := range n.members {
		if m.key == key {
			return m.val
		}
	}
	return nil
}

// Elems returns an array's elements.
func (n *Node) Elems() []*Node {
	if n == nil {
		return nil
	}
	return n.elems
}

// Set puts v (encoded as JSON) at key, replacing the member if there is one.
// The node must be an object.
func (n *Node) Set(key string, v any) {
	var val *Node
	if vn, ok := v.(*Node); ok {
		val = vn
	} else {
		b, _ := json.Marshal(v)
		val = &Node{raw: b}
		if len(b) > 0 && (b[0] == '{' || b[0] == '[') {
			val, _ = readDoc(b)
		}
	}
	for i, m := range n.members {
		if m.key == key {
			n.members[i].val = val
			return
		}
	}
	n.members = append(n.members, member{key: key, val: val})
}

// Delete removes the members whose key satisfies drop.
func (n *Node) Delete(drop func(key string) bool) {
	kept := n.members[:0]
	for _, m := range n.members {
		if !drop(m.key) {
			kept = append(kept, m)
		}
	}
	n.members = kept
}

// Object returns the object at key, creating an empty one where the key is
// absent or null.
func (n *Node) Object(key string) *Node {
	if v := n.Get(key); v != nil && v.object {
		return v
	}
	v := &Node{object: true}
	n.Set(key, v)
	return v
}

// IsObject reports whether the node is a JSON object.
func (n *Node) IsObject() bool { return n != nil && n.object }

var (
	unmarshalerType     = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// canonicalize walks n along the Go type t the way encoding/json would decode
// it, renaming matched keys to their field names and refusing duplicates.
// path is the way down to n, spelt out only in an error.
func canonicalize(n *Node, t reflect.Type, path *[]string, renamed *bool) error {
	info := typeInfoOf(t)
	if info.custom {
		return nil // read by its own method; not a field set
	}
	t = info.base
	switch {
	case n.object && t.Kind() == reflect.Struct:
		fields := info.fields
		seen := newSeen(len(n.members))
		for i, m := range n.members {
			f, ok := fields.byExact[m.key]
			if !ok {
				f, ok = fields.byFolded[foldName(m.key)]
			}
			var name string
			if ok {
				name = f.name
			} else {
				name = "?" + foldName(m.key) // unknown keys: still refuse two spellings
			}
			if prev, dup := seen.add(name, m.key); dup {
				return duplicate(path, prev, m.key)
			}
			if !ok {
				continue
			}
			if m.key != f.name {
				n.members[i].key, *renamed = f.name, true
			}
			*path = append(*path, f.name)
			if err := canonicalize(m.val, f.typ, path, renamed); err != nil {
				return err
			}
			*path = (*path)[:len(*path)-1]
		}
	case n.object && (t.Kind() == reflect.Map || t.Kind() == reflect.Interface):
		elem := t
		if t.Kind() == reflect.Map {
			elem = t.Elem()
		}
		var seen map[string]bool
		if len(n.members) > 1 {
			seen = make(map[string]bool, len(n.members))
		}
		for _, m := range n.members {
			if seen[m.key] {
				return duplicate(path, m.key, m.key)
			}
			if seen != nil {
				seen[m.key] = true
			}
			*path = append(*path, m.key)
			if err := canonicalize(m.val, elem, path, renamed); err != nil {
				return err
			}
			*path = (*path)[:len(*path)-1]
		}
	case n.array && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Interface):
		elem := t
		if t.Kind() != reflect.Interface {
			elem = t.Elem()
		}
		for i, e := range n.elems {
			if !e.object && !e.array {
				continue // a scalar has no keys
			}
			*path = append(*path, "["+strconv.Itoa(i)+"]")
			if err := canonicalize(e, elem, path, renamed); err != nil {
				return err
			}
			*path = (*path)[:len(*path)-1]
		}
	}
	return nil
}

// seenFields are the fields met in one object, with the keys that named
// them. A request's objects are small, and a slice beats a map there; an
// object of many keys gets a map, so that no body costs quadratic time.
type seenFields struct {
	list  []seenKey
	index map[string]string
}

type seenKey struct{ name, key string }

// smallObject is the most members an object is checked for twice-given
// fields by scanning.
const smallObject = 16

func newSeen(members int) *seenFields {
	if members > smallObject {
		return &seenFields{index: make(map[string]string, members)}
	}
	return &seenFields{list: make([]seenKey, 0, members)}
}

// add records that key named field name; when the field was met before, it
// returns the key that named it first.
func (s *seenFields) add(name, key string) (string, bool) {
	if s.index != nil {
		if prev, ok := s.index[name]; ok {
			return prev, true
		}
		s.index[name] = key
		return "", false
	}
	for _, k := range s.list {
		if k.name == name {
			return k.key, true
		}
	}
	s.list = append(s.list, seenKey{name: name, key: key})
	return "", false
}

// typeInfo is what canonicalize needs of a Go type, worked out once.
type typeInfo struct {
	base   reflect.Type // pointers taken off
	custom bool         // decoded by its own UnmarshalJSON or UnmarshalText
	fields fieldSet     // a struct's
}

var typeCache sync.Map // reflect.Type → *typeInfo

func typeInfoOf(t reflect.Type) *typeInfo {
	if ti, ok := typeCache.Load(t); ok {
		return ti.(*typeInfo)
	}
	base := t
	for base.Kind() == reflect.Pointer {
		base = base.Elem()
	}
	ti := &typeInfo{base: base,
		custom: reflect.PointerTo(base).Implements(unmarshalerType) || reflect.PointerTo(base).Implements(textUnmarshalerType)}
	if base.Kind() == reflect.Struct && !ti.custom {
		ti.fields = fieldsOf(base)
	}
	typeCache.Store(t, ti)
	return ti
}

func duplicate(path *[]string, first, second string) error {
	where := "at the top level"
	if len(*path) > 0 {
		where = "in " + strings.ReplaceAll(strings.Join(*path, "."), ".[", "[")
	}
	if first == second {
		return fmt.Errorf("ambiguous request: key %q is given twice %s", first, where)
	}
	return fmt.Errorf("ambiguous request: %q and %q name the same field %s (Nomad reads keys case-insensitively)", first, second, where)
}

type field struct {
	name string
	typ  reflect.Type
}

type fieldSet struct {
	byExact, byFolded map[string]field
}

// fieldsOf lists the JSON fields of a struct as encoding/json sees them: json
// tags, "-" skipped, unexported skipped, untagged embedded structs promoted
// (shallower names win). typeInfoOf keeps what it finds.
func fieldsOf(t reflect.Type) fieldSet {
	fs := fieldSet{byExact: map[string]field{}, byFolded: map[string]field{}}
	level := []reflect.Type{t}
	for len(level) > 0 {
		var next []reflect.Type
		found := map[string]field{}
		for _, st := range level {
			for i := 0; i < st.NumField(); i++ {
				sf := st.Field(i)
				tag := sf.Tag.Get("json")
				if tag == "-" {
					continue
				}
				name, _, _ := strings.Cut(tag, ",")
				ft := sf.Type
				if sf.Anonymous && name == "" {
					if ft.Kind() == reflect.Pointer {
						ft = ft.Elem()
					}
					if ft.Kind() == reflect.Struct {
						next = append(next, ft)
						continue
					}
				}
				if !sf.IsExported() {
					continue
				}
				if name == "" {
					name = sf.Name
				}
				if _, shadowed := fs.byExact[name]; !shadowed {
					found[name] = field{name: name, typ: sf.Type}
				}
			}
		}
		for name, f := range found {
			fs.byExact[name] = f
			if _, ok := fs.byFolded[foldName(name)]; !ok {
				fs.byFolded[foldName(name)] = f
			}
		}
		level = next
	}
	return fs
}

// foldName is encoding/json's case folding for matching keys to fields: ASCII
// upper case, and every other rune replaced by the smallest rune of its
// Unicode fold set (so "ſ" matches "S" and the Kelvin sign matches "K").
func foldName(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r < utf8.RuneSelf:
			if 'a' <= r && r <= 'z' {
				r -= 'a' - 'A'
			}
		default:
			r = smallestFold(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

func smallestFold(r rune) rune {
	smallest := r
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		smallest = min(smallest, f)
	}
	return smallest
}
