package policyhcl

import (
	"bytes"
	"fmt"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// MaxNesting is how deep brackets, braces, parentheses and template
// interpolations may nest in an HCL file. HCL's parser recurses once a
// level: a file nested 100,000 deep overflowed the broker's stack on
// reload, which no recover catches. Policies nest a few levels.
const MaxNesting = 256

// ParseFile parses an HCL file of the broker's (policy, config), refusing
// one nested deeper than MaxNesting before HCL's parser reads it.
func ParseFile(src []byte, filename string) (*hcl.File, hcl.Diagnostics) {
	if line, ok := tooDeep(src); ok {
		pos := hcl.Pos{Line: line, Column: 1}
		return nil, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Nested too deeply",
			Detail:  fmt.Sprintf("brackets, braces or interpolations nest more than %d levels here; a policy needs a few", MaxNesting),
			Subject: &hcl.Range{Filename: filename, Start: pos, End: pos}}}
	}
	return hclsyntax.ParseConfig(src, filename, hcl.InitialPos)
}

// lexical is where the scanner is: code (brackets count), a quoted
// string, or a heredoc.
type lexical struct {
	kind   byte   // 'c' code, 's' string, 'h' heredoc
	marker []byte // a heredoc's end marker
}

// tooDeep reports the line where src nests past MaxNesting, if it does. It
// reads HCL's lexical structure as far as nesting goes: strings and
// heredocs are text but for their ${ } and %{ } templates, which are code
// again; comments are skipped.
func tooDeep(src []byte) (int, bool) {
	stack := []lexical{{kind: 'c'}}
	line := 1
	for i := 0; i < len(src); i++ {
		c := src[i]
		if c == '\n' {
			line++
		}
		top := &stack[len(stack)-1]
		switch top.kind {
		case 's':
			switch {
			case c == '\\':
				i++ // the escaped byte
			case c == '"':
				stack = stack[:len(stack)-1]
			case (c == '$' || c == '%') && i+1 < len(src) && src[i+1] == '{':
				i++
				stack = append(stack, lexical{kind: 'c'})
			}
		case 'h':
			switch {
			case c == '\n':
				rest := src[i+1:]
				end := bytes.IndexByte(rest, '\n')
				if end < 0 {
					end = len(rest)
				}
				if bytes.Equal(bytes.TrimSpace(rest[:end]), top.marker) {
					stack = stack[:len(stack)-1]
					i += end
				}
			case (c == '$' || c == '%') && i+1 < len(src) && src[i+1] == '{':
				i++
				stack = append(stack, lexical{kind: 'c'})
			}
		default:
			switch {
			case c == '#' || c == '/' && i+1 < len(src) && src[i+1] == '/':
				for i+1 < len(src) && src[i+1] != '\n' {
					i++
				}
			case c == '/' && i+1 < len(src) && src[i+1] == '*':
				end := bytes.Index(src[i+2:], []byte("*/"))
				if end < 0 {
					return 0, false // HCL's parser reports it
				}
				line += bytes.Count(src[i:i+2+end], []byte("\n"))
				i += end + 3
			case c == '"':
				stack = append(stack, lexical{kind: 's'})
			case c == '<' && i+1 < len(src) && src[i+1] == '<':
				rest := src[i+2:]
				end := bytes.IndexByte(rest, '\n')
				if end < 0 {
					return 0, false
				}
				marker := bytes.TrimSpace(bytes.TrimPrefix(rest[:end], []byte("-")))
				stack = append(stack, lexical{kind: 'h', marker: marker})
				i += 1 + end // the next byte is the newline, which the heredoc reads
			case c == '{' || c == '[' || c == '(':
				stack = append(stack, lexical{kind: 'c'})
			case (c == '}' || c == ']' || c == ')') && len(stack) > 1:
				stack = stack[:len(stack)-1]
			}
		}
		if len(stack) > MaxNesting {
			return line, true
		}
	}
	return 0, false
}
