package cluster

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// Frames reads Nomad's event stream: one frame a line (Nomad writes each
// as its own line of newline-delimited JSON; a line break inside a value
// is always escaped), heartbeats ({}) included.
type Frames struct {
	r    *bufio.Reader
	line []byte
	cut  []byte
}

// NewFrames reads frames from r.
func NewFrames(r io.Reader) *Frames { return &Frames{r: bufio.NewReaderSize(r, 64<<10)} }

// Next decodes the next frame into f; io.EOF once the stream ends between
// frames.
//
// Nomad puts the whole job in every allocation event, most of the frame's
// bytes, and the view reads none of it (eventAlloc). Yet encoding/json
// scans every byte twice, skipped values too: once to find the value's
// end, once to decode it. So each allocation's job is cut to null first,
// in one pass that skips strings with bytes.IndexByte.
func (fr *Frames) Next(f *Events) error {
	fr.line = fr.line[:0]
	for {
		chunk, err := fr.r.ReadSlice('\n')
		fr.line = append(fr.line, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err == io.EOF && len(bytes.TrimSpace(fr.line)) > 0 {
			return io.ErrUnexpectedEOF // a frame cut short
		}
		if err != nil {
			return err
		}
		if len(bytes.TrimSpace(fr.line)) > 0 {
			break
		}
		fr.line = fr.line[:0]
	}
	fr.cut = cutAllocationJobs(fr.cut[:0], fr.line)
	return json.Unmarshal(fr.cut, f)
}

// cutAllocationJobs appends to dst the frame b with the value of each
// Events[].Payload.Allocation.Job replaced by null. A frame it cannot
// follow is appended whole, for the decoder to refuse.
func cutAllocationJobs(dst, b []byte) []byte {
	// The keys of the open objects and arrays, innermost last: all the
	// cut needs to know is whether it is inside a Payload's Allocation.
	const (
		other = iota
		payload
		allocation
	)
	var buf [32]uint8
	stack, key, last := buf[:0], uint8(other), 0
	for i := 0; i < len(b); {
		switch b[i] {
		case '"':
			end := stringEnd(b, i)
			if end < 0 {
				return append(dst, b...)
			}
			j := skipSpace(b, end)
			if j >= len(b) || b[j] != ':' { // a string value
				i = end
				continue
			}
			switch name := b[i+1 : end-1]; {
			case string(name) == "Payload":
				key = payload
			case string(name) == "Allocation":
				key = allocation
			case string(name) == "Job" && len(stack) >= 2 && stack[len(stack)-1] == allocation && stack[len(stack)-2] == payload:
				start := skipSpace(b, j+1)
				stop := valueEnd(b, start)
				if stop < 0 {
					return append(dst, b...)
				}
				dst = append(append(dst, b[last:start]...), "null"...)
				last, i = stop, stop
				continue
			default:
				key = other
			}
			i = j + 1
		case '{', '[':
			stack, key = append(stack, key), other // an array's elements have no key
			i++
		case '}', ']':
			if len(stack) == 0 {
				return append(dst, b...)
			}
			stack = stack[:len(stack)-1]
			i++
		default:
			i++
		}
	}
	return append(dst, b[last:]...)
}

// stringEnd is the index after the string that opens at b[i]; -1 if it
// does not end.
func stringEnd(b []byte, i int) int {
	for j := i + 1; ; {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1
		}
		j += k
		backslashes := 0
		for b[j-1-backslashes] == '\\' {
			backslashes++
		}
		if backslashes%2 == 0 {
			return j + 1
		}
		j++
	}
}

// valueEnd is the index after the JSON value that starts at b[i]; -1 if
// it does not end.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); {
			switch b[j] {
			case '"':
				if j = stringEnd(b, j); j < 0 {
					return -1
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
			j++
		}
		return -1
	default: // a number, true, false or null
		j := i
		for ; j < len(b); j++ {
			switch b[j] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				return j
			}
		}
		return j
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}
