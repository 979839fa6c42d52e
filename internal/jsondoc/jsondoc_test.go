package jsondoc

import (
	"fmt"
	"strings"
	"testing"
)

// A field given twice is refused in an object of any size: small ones are
// checked by scanning, large ones (as a hostile body makes them) by a map.
func TestAFieldGivenTwiceIsRefusedInObjectsOfAnySize(t *testing.T) {
	type target struct{ Name string }
	for _, extra := range []int{0, smallObject, 10 * smallObject} {
		var keys []string
		for i := range extra {
			keys = append(keys, fmt.Sprintf(`"unknown%d":1`, i))
		}
		body := `{` + strings.Join(append(keys, `"Name":"a"`, `"name":"b"`), ",") + `}`
		var out target
		_, err := Parse([]byte(body), &out)
		if err == nil || !strings.Contains(err.Error(), `"Name" and "name" name the same field`) {
			t.Errorf("%d other keys: %v", extra, err)
		}
		body = `{` + strings.Join(append(keys, `"Name":"a"`), ",") + `}`
		if _, err := Parse([]byte(body), &out); err != nil || out.Name != "a" {
			t.Errorf("%d other keys, no duplicate: %v %q", extra, err, out.Name)
		}
	}
}
