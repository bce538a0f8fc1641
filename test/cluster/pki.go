package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the cluster's throwaway certificate authority and the key pairs
// the control plane needs, all written under one directory:
//
//	ca.crt              the CA; kubeconfigs trust it, the API server checks client certs against it
//	apiserver.{crt,key} the API server's serving pair (SANs below)
//	admin.{crt,key}     the administrator's client pair (group system:masters)
//	sa.{key,pub}        the service-account token signing pair
type pki struct {
	dir string
	// caPEM, adminCertPEM and adminKeyPEM go into kubeconfigs.
	caPEM, adminCertPEM, adminKeyPEM []byte
}

// Admin identity: a member of system:masters, which the API server lets do
// anything; only the harness uses it (the operator and the agents get
// ServiceAccount tokens bound to proxyshift's own ClusterRoles).
const (
	adminUser  = "proxyshift-localcluster-admin"
	adminGroup = "system:masters"
)

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// newPKI creates the CA and the pairs. The serving certificate names the
// API server's fabric address, 127.0.0.1 (the root-namespace forwarder and
// loopback clients inside the control-plane namespace), the kubernetes
// Service's cluster IP and the usual in-cluster DNS names.
func newPKI(dir string, serveIPs []net.IP) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &pki{dir: dir}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "proxyshift-localcluster-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(30 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	p.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	if err := writePEM(p.path("ca.crt"), p.caPEM); err != nil {
		return nil, err
	}
	caKeyPEM, err := keyPEM(caKey)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.path("ca.key"), caKeyPEM); err != nil {
		return nil, err
	}

	issue := func(tmpl *x509.Certificate) (certPEM, keyPEMBytes []byte, err error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		tmpl.SerialNumber = serial()
		tmpl.NotBefore = now.Add(-time.Hour)
		tmpl.NotAfter = now.Add(30 * 24 * time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return nil, nil, err
		}
		kp, err := keyPEM(key)
		if err != nil {
			return nil, nil, err
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), kp, nil
	}

	servCert, servKey, err := issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: serveIPs,
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"},
	})
	if err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	if err := writePEM(p.path("apiserver.crt"), servCert); err != nil {
		return nil, err
	}
	if err := writePEM(p.path("apiserver.key"), servKey); err != nil {
		return nil, err
	}

	p.adminCertPEM, p.adminKeyPEM, err = issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: adminUser, Organization: []string{adminGroup}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, fmt.Errorf("admin certificate: %w", err)
	}
	if err := writePEM(p.path("admin.crt"), p.adminCertPEM); err != nil {
		return nil, err
	}
	if err := writePEM(p.path("admin.key"), p.adminKeyPEM); err != nil {
		return nil, err
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	saKeyPEM, err := keyPEM(saKey)
	if err != nil {
		return nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.path("sa.key"), saKeyPEM); err != nil {
		return nil, err
	}
	if err := writePEM(p.path("sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})); err != nil {
		return nil, err
	}
	return p, nil
}

func keyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func writePEM(path string, b []byte) error { return os.WriteFile(path, b, 0o600) }

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}
