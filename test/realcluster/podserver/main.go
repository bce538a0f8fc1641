// Command podserver is the backend of the real-node cluster's Deployment
// (test/realcluster): a static server answering on port 8080, TCP and UDP,
// with the pod's name, in the protocol of the namespace lab's servers
// (netlab.Server), so the tests tell which pod a Service sent them to with
// netlab's Request. The pod's name is its hostname, which the kubelet sets
// to the pod's name.
package main

import (
	"flag"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/proxyshift/proxyshift/test/netlab"
)

func main() {
	host, _ := os.Hostname()
	name := flag.String("name", host, "name to answer with (default: the hostname, i.e. the pod's name)")
	port := flag.Int("port", netlab.ServerPort, "TCP and UDP port to serve on")
	flag.Parse()
	s, err := netlab.Serve(*name, *port)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("podserver %s: serving TCP and UDP on :%d", *name, *port)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	<-sigs
	s.Stop()
}
