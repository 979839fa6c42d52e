package agent

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/broker/config"
)

// The policy step refuses a broker whose policy is invalid, naming the file
// and line, before anything listens or leads.
func TestSetupPolicyRefusesAnInvalidPolicy(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "p.hcl"), []byte("queue \"training\" {\n  priority = \"high\"\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := New(&config.Config{PolicyDir: dir}, hclog.NewNullLogger(), nil)
	err := a.setupPolicy(context.Background())
	if err == nil || !strings.Contains(err.Error(), "p.hcl:2") {
		t.Fatalf("got %v, want the file and line of the bad value", err)
	}
	if a.policies != nil {
		t.Errorf("a policy store was kept")
	}
}

// The policy step keeps a valid policy and the view it sizes quotas by.
func TestSetupPolicyLoadsAValidPolicy(t *testing.T) {
	dir := t.TempDir()
	src := "queue \"training\" { priority = 60 }\ntenant \"vision\" {\n  namespaces = [\"vision\"]\n  queues = [\"training\"]\n  guaranteed = 1\n}\n"
	if err := os.WriteFile(filepath.Join(dir, "p.hcl"), []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	a := New(&config.Config{PolicyDir: dir}, hclog.NewNullLogger(), nil)
	if err := a.setupPolicy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if a.view == nil || a.policies.Current().Tenants["vision"] == nil {
		t.Fatalf("view %v, policy %+v", a.view, a.policies.Current())
	}
}

// A TLS listener's log stays quiet at the default level when a connection
// opens and closes without a handshake, as the followers' check of the
// leader's address does every half second, and still warns of a handshake
// that failed.
func TestServerLogQuietForAConnectionClosedBeforeItsHandshake(t *testing.T) {
	var mu sync.Mutex
	var out strings.Builder
	logged := func() string { mu.Lock(); defer mu.Unlock(); return out.String() }
	l := hclog.New(&hclog.LoggerOptions{Output: writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return out.Write(p)
	}), Level: hclog.Info})
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	srv.Config.ErrorLog = serverLog(l)
	srv.StartTLS()
	defer srv.Close()
	addr := srv.Listener.Addr().String()

	for range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	resp, err := http.Get("http://" + addr) // plain HTTP to a TLS listener
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logged(), "HTTP request to an HTTPS server") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	got := logged()
	if !strings.Contains(got, "[WARN]") || !strings.Contains(got, "HTTP request to an HTTPS server") {
		t.Errorf("a failed handshake was not warned of; the log:\n%s", got)
	}
	if strings.Contains(got, "EOF") {
		t.Errorf("connections closed before a handshake were logged at the default level:\n%s", got)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
