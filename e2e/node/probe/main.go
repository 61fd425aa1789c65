// kandev-node-probe: the only program of the e2e real node's test image (e2e/node.sh images).
//
//	probe sleep          wait for SIGTERM/SIGINT (the container's main process)
//	probe cat            copy stdin to stdout until EOF (exec with stdin)
//	probe id             print uid, gid and groups
//	probe write PATH     write PATH, read it back, print its owner
//	probe apiserver      as an in-cluster client does: dial KUBERNETES_SERVICE_HOST:PORT over TLS,
//	                     verifying the server certificate against the service account's ca.crt
//	                     and the dialed IP, then GET /version with the service account token
package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

const sa = "/var/run/secrets/kubernetes.io/serviceaccount"

func main() {
	if len(os.Args) < 2 {
		fail("usage: probe sleep|cat|id|write PATH|apiserver")
	}
	switch os.Args[1] {
	case "sleep":
		fmt.Println("probe: sleeping")
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
		s := <-ch
		fmt.Printf("probe: %v, exiting\n", s)
	case "cat":
		if _, err := io.Copy(os.Stdout, os.Stdin); err != nil {
			fail(err.Error())
		}
	case "id":
		groups, _ := os.Getgroups()
		fmt.Printf("uid=%d gid=%d groups=%v\n", os.Getuid(), os.Getgid(), groups)
	case "write":
		if len(os.Args) < 3 {
			fail("write PATH")
		}
		p := os.Args[2]
		want := fmt.Sprintf("written by uid %d at %s\n", os.Getuid(), time.Now().Format(time.RFC3339))
		if err := os.WriteFile(p, []byte(want), 0o644); err != nil {
			fail(err.Error())
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != want {
			fail(fmt.Sprintf("read back %q: %v", got, err))
		}
		st, _ := os.Stat(p)
		sys := st.Sys().(*syscall.Stat_t)
		fmt.Printf("ok: %s owner %d:%d: %s", p, sys.Uid, sys.Gid, got)
	case "apiserver":
		apiserver()
	default:
		fail("unknown command " + os.Args[1])
	}
}

func apiserver() {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		fail("KUBERNETES_SERVICE_HOST/PORT not set")
	}
	pem, err := os.ReadFile(sa + "/ca.crt")
	if err != nil {
		fail(err.Error())
	}
	token, err := os.ReadFile(sa + "/token")
	if err != nil {
		fail(err.Error())
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		fail("no certificate in ca.crt")
	}
	// ServerName = the dialed IP: Go checks it against the certificate's IP SANs, as rustls does.
	cfg := &tls.Config{RootCAs: pool, ServerName: host}
	addr := net.JoinHostPort(host, port)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	req, _ := http.NewRequest("GET", "https://"+addr+"/version", nil)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := client.Do(req)
	if err != nil {
		fail(err.Error())
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	leaf := resp.TLS.PeerCertificates[0]
	fmt.Printf("dialed %s: TLS verified (issuer %q, IP SANs %v)\nHTTP %s: %s\n", addr,
		leaf.Issuer.CommonName, leaf.IPAddresses, resp.Status, strings.Join(strings.Fields(string(body)), " "))
	if resp.StatusCode != 200 {
		os.Exit(1)
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "probe: "+msg)
	os.Exit(1)
}
