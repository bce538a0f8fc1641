package controlplane

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

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// PKI is a cluster's throwaway certificate authority and the key pairs it
// issued, all written under one directory:
//
//	ca.{crt,key}        the CA; kubeconfigs trust it, the API server checks client certs against it
//	sa.{key,pub}        the service-account token signing pair
//	admin.{crt,key}     the administrator's client pair (group system:masters)
//	NAME.{crt,key}      every pair issued later (IssueServing, IssueClient)
type PKI struct {
	// Dir holds the files.
	Dir string
	// CAPEM is the CA certificate; AdminCertPEM and AdminKeyPEM are the
	// administrator's pair. They go into kubeconfigs and client configs.
	CAPEM, AdminCertPEM, AdminKeyPEM []byte

	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
	now   time.Time
}

// Admin identity: a member of system:masters, which the API server lets do
// anything; only the harnesses use it (the programs they run get their own
// identities).
const (
	AdminUser  = "proxyshift-localcluster-admin"
	AdminGroup = "system:masters"
)

// validity is the lifetime of every certificate; a cluster running longer
// needs a restart.
const validity = 30 * 24 * time.Hour

// Path is the file called name in the PKI's directory.
func (p *PKI) Path(name string) string { return filepath.Join(p.Dir, name) }

// NewPKI creates the CA, the service-account signing pair and the
// administrator's client pair under dir.
func NewPKI(dir string) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &PKI{Dir: dir, now: time.Now()}
	var err error
	if p.caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "proxyshift-localcluster-ca"},
		NotBefore:             p.now.Add(-time.Hour),
		NotAfter:              p.now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &p.caKey.PublicKey, p.caKey)
	if err != nil {
		return nil, err
	}
	if p.ca, err = x509.ParseCertificate(caDER); err != nil {
		return nil, err
	}
	p.CAPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	caKeyPEM, err := keyPEM(p.caKey)
	if err != nil {
		return nil, err
	}
	if err := writePair(p.Path("ca"), p.CAPEM, caKeyPEM); err != nil {
		return nil, err
	}
	if p.AdminCertPEM, p.AdminKeyPEM, err = p.IssueClient("admin", AdminUser, AdminGroup); err != nil {
		return nil, fmt.Errorf("admin certificate: %w", err)
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
	if err := writePEM(p.Path("sa.key"), saKeyPEM); err != nil {
		return nil, err
	}
	if err := writePEM(p.Path("sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})); err != nil {
		return nil, err
	}
	return p, nil
}

// IssueServing issues a serving pair for cn with the given SANs and writes
// it as name.crt and name.key.
func (p *PKI) IssueServing(name, cn string, ips []net.IP, dnsNames []string) error {
	_, _, err := p.issue(name, &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: ips,
		DNSNames:    dnsNames,
	})
	return err
}

// IssueClient issues a client pair for user cn in groups orgs (what the
// API server's x509 authenticator reads), writes it as name.crt and
// name.key, and returns the PEM blocks.
func (p *PKI) IssueClient(name, cn string, orgs ...string) (certPEM, keyPEMBytes []byte, err error) {
	return p.issue(name, &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn, Organization: orgs},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

func (p *PKI) issue(name string, tmpl *x509.Certificate) (certPEM, keyPEMBytes []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = p.now.Add(-time.Hour)
	tmpl.NotAfter = p.now.Add(validity)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("certificate %s: %w", name, err)
	}
	kp, err := keyPEM(key)
	if err != nil {
		return nil, nil, err
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return certPEM, kp, writePair(p.Path(name), certPEM, kp)
}

// WriteKubeconfig writes a kubeconfig for server, trusting the PKI's CA,
// with user's credentials auth.
func (p *PKI) WriteKubeconfig(path, server, user string, auth *clientcmdapi.AuthInfo) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["proxyshift-local"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: p.CAPEM}
	cfg.AuthInfos[user] = auth
	cfg.Contexts["proxyshift-local"] = &clientcmdapi.Context{Cluster: "proxyshift-local", AuthInfo: user}
	cfg.CurrentContext = "proxyshift-local"
	return clientcmd.WriteToFile(*cfg, path)
}

// WriteClientKubeconfig issues a client pair for user cn in groups orgs
// (see IssueClient) and writes a kubeconfig for server using it.
func (p *PKI) WriteClientKubeconfig(path, server, name, cn string, orgs ...string) error {
	cert, key, err := p.IssueClient(name, cn, orgs...)
	if err != nil {
		return err
	}
	return p.WriteKubeconfig(path, server, cn, &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key})
}

func keyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func writePair(base string, cert, key []byte) error {
	if err := writePEM(base+".crt", cert); err != nil {
		return err
	}
	return writePEM(base+".key", key)
}

func writePEM(path string, b []byte) error { return os.WriteFile(path, b, 0o600) }

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}
