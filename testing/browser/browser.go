// Package browser drives a real headless Chromium (Debian's `chromium`
// package) for the web UI's tests, and keeps their screenshots as test
// artefacts.
package browser

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Path finds Chromium: $CHROMIUM, else chromium or chromium-browser on the
// PATH. Without it the test is skipped locally, but fails in CI (CI=true).
func Path(t testing.TB) string {
	t.Helper()
	if testing.Short() && os.Getenv("CI") == "" {
		t.Skip("browser test: needs Chromium, skipped with -short (never in CI)")
	}
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "chromium not found (set $CHROMIUM, or `apt-get install chromium chromium-driver`; .ci/run installs it)"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// New starts a headless Chromium with a fresh profile, closed with the
// test, and returns a tab's context.
func New(t testing.TB) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(Path(t)),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 900),
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil { // the first run starts the browser
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// Run runs an action in the tab, bounded by timeout, and returns its value.
func Run[T any](t testing.TB, ctx context.Context, timeout time.Duration, action chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	v, err := chromedp.Run(ctx, action)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	return v
}

// Eval evaluates a JavaScript expression in the page.
func Eval[T any](t testing.TB, ctx context.Context, expr string) T {
	t.Helper()
	return Run(t, ctx, 10*time.Second, chromedp.Evaluate[T](expr))
}

// WaitFor polls a JavaScript expression until it is true, failing the test
// with what describe (another expression) says after timeout.
func WaitFor(t testing.TB, ctx context.Context, timeout time.Duration, what, expr, describe string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if Eval[bool](t, ctx, "!!("+expr+")") {
			return
		}
		if time.Now().After(deadline) {
			got := Eval[any](t, ctx, describe)
			Screenshot(t, ctx, "failed-"+strings.ReplaceAll(what, " ", "-"))
			t.Fatalf("browser: %s not seen within %s; the page shows %v", what, timeout, got)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ArtefactDir is where tests leave what a person should look at:
// $ARTEFACT_DIR, else artefacts/ at the repository's root.
func ArtefactDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("ARTEFACT_DIR")
	if dir == "" {
		root, err := os.Getwd()
		if err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
				break
			}
			parent := filepath.Dir(root)
			if parent == root {
				t.Fatal("no go.mod above the test's directory")
			}
			root = parent
		}
		dir = filepath.Join(root, "artefacts")
	}
	dir = filepath.Join(dir, "screenshots")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Screenshot saves the whole page as <artefacts>/screenshots/<name>.png and
// returns its path.
func Screenshot(t testing.TB, ctx context.Context, name string) string {
	t.Helper()
	png := Run(t, ctx, 20*time.Second, chromedp.FullScreenshot(100))
	path := filepath.Join(ArtefactDir(t), name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
	return path
}

// Navigate opens url and waits for the page's body.
func Navigate(t testing.TB, ctx context.Context, url string) {
	t.Helper()
	Run(t, ctx, 30*time.Second, chromedp.Steps(chromedp.Navigate(url), chromedp.WaitReady("body")))
}
