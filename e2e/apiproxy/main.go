// kandev-apiproxy: an HTTPS reverse proxy between an operator under test and the API server
// that can answer every request with an HTTP error for a while, which a TCP fault proxy
// (toxiproxy) cannot do without terminating TLS. Used by tests/e2e_faults.rs; built by
// e2e/bin.sh from this directory (standard library only).
//
// It terminates TLS with a certificate of its own for 127.0.0.1 (its CA is written to
// <dir>/ca.crt), forwards to the API server with the given client certificate, and passes
// upgrades (exec) and watches through. Its control endpoint:
//
//	POST   /fault?status=503&seconds=30  answer new requests with that status for that long,
//	                                     and end the watches that are open
//	DELETE /fault                        stop answering with errors
//	GET    /stats                        {"forwarded": N, "refused": N}
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

type fault struct {
	mu     sync.Mutex
	status int
	until  time.Time
	// Closed when a fault starts: open watches end with it.
	started chan struct{}
}

func (f *fault) current() (int, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.status != 0 && time.Now().Before(f.until) {
		return f.status, true
	}
	return 0, false
}

func (f *fault) start(status int, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status, f.until = status, time.Now().Add(d)
	close(f.started)
	f.started = make(chan struct{})
}

func (f *fault) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status = 0
}

func (f *fault) startedChan() chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.started
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address of the proxied API")
	control := flag.String("control", "127.0.0.1:0", "address of the control endpoint")
	upstream := flag.String("upstream", "", "the API server, https://host:port")
	caFile := flag.String("ca", "", "the API server's CA bundle")
	certFile := flag.String("cert", "", "client certificate for the API server")
	keyFile := flag.String("key", "", "client key for the API server")
	dir := flag.String("dir", ".", "where to write ca.crt and addresses.json")
	flag.Parse()
	if err := run(*listen, *control, *upstream, *caFile, *certFile, *keyFile, *dir); err != nil {
		log.Fatalf("kandev-apiproxy: %v", err)
	}
}

func run(listen, control, upstream, caFile, certFile, keyFile, dir string) error {
	target, err := url.Parse(upstream)
	if err != nil || target.Host == "" {
		return fmt.Errorf("--upstream %q: not a URL", upstream)
	}
	clientCert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return fmt.Errorf("client certificate: %w", err)
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return fmt.Errorf("CA bundle: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("CA bundle %s: no certificate", caFile)
	}
	serving, servingCA, err := selfSigned()
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), servingCA, 0o644); err != nil {
		return err
	}

	// HTTP/1.1 upstream: upgrades (exec) need it.
	transport := &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{clientCert}},
		MaxIdleConnsPerHost: 64,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = target.Host
		},
		Transport:     transport,
		FlushInterval: -1,
		ErrorLog:      log.New(os.Stderr, "proxy: ", log.LstdFlags),
	}

	f := &fault{started: make(chan struct{})}
	var forwarded, refused atomic.Int64
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if status, failing := f.current(); failing {
			refused.Add(1)
			answer(w, status)
			return
		}
		forwarded.Add(1)
		if r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1" {
			ctx, cancel := context.WithCancel(r.Context())
			defer cancel()
			started := f.startedChan()
			go func() {
				select {
				case <-started:
					cancel()
				case <-ctx.Done():
				}
			}()
			r = r.WithContext(ctx)
		}
		proxy.ServeHTTP(w, r)
	})

	apiListener, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	controlListener, err := net.Listen("tcp", control)
	if err != nil {
		return err
	}
	addresses, _ := json.Marshal(map[string]string{
		"api": apiListener.Addr().String(), "control": controlListener.Addr().String(),
	})
	// Written last, atomically: its presence means the proxy is ready.
	tmp := filepath.Join(dir, "addresses.json.tmp")
	if err := os.WriteFile(tmp, addresses, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "addresses.json")); err != nil {
		return err
	}

	controlMux := http.NewServeMux()
	controlMux.HandleFunc("POST /fault", func(w http.ResponseWriter, r *http.Request) {
		status, err1 := strconv.Atoi(r.URL.Query().Get("status"))
		seconds, err2 := strconv.ParseFloat(r.URL.Query().Get("seconds"), 64)
		if err1 != nil || err2 != nil || status < 400 || status > 599 || seconds <= 0 {
			http.Error(w, "want ?status=4xx|5xx&seconds=N", http.StatusBadRequest)
			return
		}
		f.start(status, time.Duration(seconds*float64(time.Second)))
		log.Printf("answering %d for %gs", status, seconds)
		w.WriteHeader(http.StatusNoContent)
	})
	controlMux.HandleFunc("DELETE /fault", func(w http.ResponseWriter, r *http.Request) {
		f.stop()
		log.Printf("fault removed")
		w.WriteHeader(http.StatusNoContent)
	})
	controlMux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]int64{
			"forwarded": forwarded.Load(), "refused": refused.Load(),
		})
	})
	go func() {
		log.Fatal(http.Serve(controlListener, controlMux))
	}()

	server := &http.Server{
		Handler:   api,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{serving}},
		// HTTP/1.1 only, as upgrades need.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ErrorLog:     log.New(os.Stderr, "server: ", log.LstdFlags),
	}
	log.Printf("proxying %s -> %s, control on %s", apiListener.Addr(), upstream, controlListener.Addr())
	return server.ServeTLS(apiListener, "", "")
}

// answer writes the API server's own shape of an error: a v1 Status.
func answer(w http.ResponseWriter, status int) {
	body, _ := json.Marshal(map[string]any{
		"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{},
		"status": "Failure", "message": "injected by kandev-apiproxy",
		"reason": reason(status), "code": status,
	})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func reason(status int) string {
	switch status {
	case http.StatusServiceUnavailable:
		return "ServiceUnavailable"
	case http.StatusTooManyRequests:
		return "TooManyRequests"
	case http.StatusGatewayTimeout:
		return "Timeout"
	default:
		return "InternalError"
	}
}

// selfSigned makes a CA and a serving certificate it signed for 127.0.0.1 and localhost (rustls
// refuses a CA certificate as the server's own); returns the serving pair and the CA's PEM.
func selfSigned() (tls.Certificate, []byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(now.UnixNano()),
		Subject:               pkix.Name{CommonName: "kandev-apiproxy CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	leafTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(now.UnixNano() + 1),
		Subject:               pkix.Name{CommonName: "kandev-apiproxy"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, leafTemplate, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	cert, err := tls.X509KeyPair(
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	)
	return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), err
}
