// Command proxyshift-agent is the per-node service proxy. This build is the
// foundation skeleton: it serves its health endpoints and says plainly that
// it programs no rules yet.
package main

import (
	"flag"
	"log"
	"net/http"
	"os"
)

func main() {
	nodeName := flag.String("node-name", os.Getenv("NODE_NAME"), "Name of the node this agent runs on (default $NODE_NAME).")
	healthzAddr := flag.String("healthz-bind-address", ":10266", "Address the /healthz and /livez endpoints bind to.")
	flag.Parse()

	log.Printf("proxyshift-agent on node %q: no dataplane is built into this version; it programs no rules", *nodeName)
	ok := func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) }
	http.HandleFunc("/healthz", ok)
	http.HandleFunc("/livez", ok)
	log.Fatal(http.ListenAndServe(*healthzAddr, nil))
}
