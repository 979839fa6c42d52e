package queue_test

import (
	"bytes"
	"compress/gzip"
	"testing"

	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

// An entry's request reads the same whether it is held as sent or packed,
// and a packed one that is not gzip says so rather than reading as nothing.
func TestAnEntrysBodyIsItsRequestHoweverHeld(t *testing.T) {
	request := []byte(`{"Job":{"ID":"train","Meta":{"pad":"` + string(bytes.Repeat([]byte("x"), 2000)) + `"}}}`)
	var packed bytes.Buffer
	zw := gzip.NewWriter(&packed)
	zw.Write(request)
	zw.Close()
	for name, e := range map[string]queue.Entry{
		"as sent": {ID: "a", Request: request},
		"packed":  {ID: "b", Packed: packed.Bytes(), RequestBytes: len(request)},
	} {
		body, err := e.Body()
		if err != nil || !bytes.Equal(body, request) || e.Size() != len(request) {
			t.Errorf("%s: %d bytes (size %d), %v", name, len(body), e.Size(), err)
		}
	}
	if body, err := (queue.Entry{ID: "c", Packed: request, RequestBytes: len(request)}).Body(); err == nil {
		t.Errorf("a packed request that is not gzip read as %.40s", body)
	}
}
