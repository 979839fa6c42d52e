// Package webui is the broker's web UI at /gpu/: plain HTML, CSS and
// JavaScript with no build step, embedded in the binary (nothing is fetched
// from elsewhere at run time). It draws what the broker's /v1/gpu API says
// and decides nothing itself.
package webui

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed static
var files embed.FS

// Prefix is the path the UI is served under. Not /ui/: that is Nomad's own
// UI, which the broker passes through.
const Prefix = "/gpu/"

// Handler serves the UI's files under Prefix.
func Handler() http.Handler {
	static, err := fs.Sub(files, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.StripPrefix(strings.TrimSuffix(Prefix, "/"), http.FileServer(http.FS(static)))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "nomad-gpu: the web UI is read with GET", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		// Only the broker's own files and API: the token typed in cannot be
		// sent anywhere else, nor the page framed.
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
