// Command barehop is a bare reverse-proxy hop (net/http/httputil) in a
// process of its own: the baseline the broker's benchmark compares with.
package main

import (
	"flag"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve")
	target := flag.String("target", "", "Nomad's address")
	flag.Parse()
	u, err := url.Parse(*target)
	if err != nil || u.Host == "" {
		log.Fatalf("barehop: -target %q is not an address", *target)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	// As many kept connections as the broker's own transport to Nomad.
	proxy.Transport = &http.Transport{MaxIdleConnsPerHost: 256}
	log.Fatal(http.ListenAndServe(*listen, proxy))
}
