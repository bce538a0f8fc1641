// Command apiserver is the test VM's API server (hack/vm/run.sh starts it
// on the host for the packages of hack/vm/packages.txt marked
// "apiserver"): the VM's emulated CPU would take minutes to start
// kube-apiserver and etcd, so they run on the host, listening on
// 127.0.0.1 only, and the guest reaches them through qemu's user-mode
// network, whose only way out is a guestfwd to this program's relay.
//
//	apiserver -assets DIR -guest-kubeconfig FILE -server URL
//
// starts the test control plane (test/testenv: kube-apiserver and etcd
// from DIR, proxyshift's CRDs installed), writes FILE, an administrator's
// kubeconfig for the guest naming the server URL (the guestfwd address)
// with the serving certificate's name "localhost", prints
// "apiserver ready 127.0.0.1:PORT" and runs until its standard input
// closes or it gets SIGTERM or SIGINT; then it stops the control plane.
//
//	apiserver relay 127.0.0.1:PORT
//
// is what qemu runs for each connection the guest opens to the guestfwd
// address (its "cmd:" form): it copies its standard input to a TCP
// connection to the address and the connection's data to its standard
// output, until either side ends.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/tools/clientcmd"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/proxyshift/proxyshift/test/testenv"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("vm apiserver: ")
	if len(os.Args) == 3 && os.Args[1] == "relay" {
		if err := relay(os.Args[2]); err != nil {
			log.Fatal(err)
		}
		return
	}
	var (
		assets     = flag.String("assets", os.Getenv("KUBEBUILDER_ASSETS"), "Directory with kube-apiserver and etcd (hack/controlplane.sh prints it).")
		kubeconfig = flag.String("guest-kubeconfig", "", "Where to write the guest's kubeconfig.")
		server     = flag.String("server", "https://198.18.254.100:6443", "The API server's URL as the guest reaches it (qemu's guestfwd address).")
	)
	flag.Parse()
	if *assets == "" || *kubeconfig == "" {
		log.Fatal("-assets and -guest-kubeconfig are required")
	}
	if err := run(*assets, *kubeconfig, *server); err != nil {
		log.Fatal(err)
	}
}

func run(assets, kubeconfig, server string) error {
	logf.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	dir, err := os.MkdirTemp("", "proxyshift-vm-apiserver-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	env, err := testenv.Launch(assets, dir)
	if err != nil {
		return err
	}
	defer func() {
		if err := env.Stop(); err != nil {
			log.Printf("stop the control plane: %v", err)
		}
	}()
	host, err := url.Parse(env.Config.Host)
	if err != nil {
		return err
	}
	if err := writeGuestKubeconfig(env.Kubeconfig, kubeconfig, server); err != nil {
		return err
	}

	// Signals stay caught until the control plane is stopped (a second
	// one must not kill this program halfway, leaving etcd behind).
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	eof := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(eof)
	}()
	fmt.Printf("apiserver ready %s\n", host.Host)
	select {
	case <-sigs:
	case <-eof:
	}
	return nil
}

// writeGuestKubeconfig writes the administrator's kubeconfig from to to,
// pointing every cluster at server, with TLS names checked against
// "localhost" (a name in the serving certificate; the guest's address for
// the server is not).
func writeGuestKubeconfig(from, to, server string) error {
	cfg, err := clientcmd.LoadFromFile(from)
	if err != nil {
		return err
	}
	if len(cfg.Clusters) == 0 {
		return errors.New("the control plane's kubeconfig names no cluster")
	}
	for _, c := range cfg.Clusters {
		c.Server = server
		c.TLSServerName = "localhost"
	}
	return clientcmd.WriteToFile(*cfg, to)
}

// relay copies standard input to a connection to addr and the
// connection's data to standard output, until either direction ends (the
// guest's HTTP clients need no half-closed connections): then the process
// exits, which closes the guest's connection.
func relay(addr string) error {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(os.Stdout, conn)
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(conn, os.Stdin)
		done <- struct{}{}
	}()
	<-done
	return nil
}
