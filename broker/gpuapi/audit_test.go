package gpuapi

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/front"
)

func TestSinceParam(t *testing.T) {
	for query, want := range map[string]string{"": "168h0m0s", "since=1h": "1h0m0s",
		"since=soon": `400 nomad-gpu: since="soon" is not a duration such as 168h`, "since=-1h": `400 nomad-gpu: since="-1h" is not a duration such as 168h`} {
		d, err := sinceParam(httptest.NewRequest(http.MethodGet, "/v1/gpu/trace?"+query, nil), 7*24*time.Hour)
		got := d.String()
		if err != nil {
			got = fmt.Sprint(front.StatusOf(err), " nomad-gpu: ", err)
		}
		if !strings.Contains(got, want) {
			t.Errorf("%q: got %s, want %s", query, got, want)
		}
	}
}
