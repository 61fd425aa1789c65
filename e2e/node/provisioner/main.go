// kandev-local-provisioner: the dynamic PersistentVolume provisioner of the e2e real node
// (e2e/node.sh). Standard library only; it talks to the API server with a client certificate.
//
// Every second it lists the StorageClasses whose provisioner is -provisioner, and for every
// Pending claim of one of them without a volume it creates a directory <dir>/pvc-<uid> (mode
// 0777) and a `local` PersistentVolume pre-bound to the claim (claimRef), with a node affinity
// to -node; kube-controller-manager binds the pair. A `local` volume (unlike hostPath) gets the
// pod's fsGroup applied by the kubelet, so a non-root pod can write to it. A Released volume of
// ours with reclaim policy Delete is deleted, and its directory too.
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

const provisionedBy = "pv.kubernetes.io/provisioned-by"

type meta struct {
	Name              string            `json:"name"`
	Namespace         string            `json:"namespace,omitempty"`
	UID               string            `json:"uid,omitempty"`
	DeletionTimestamp *string           `json:"deletionTimestamp,omitempty"`
	Annotations       map[string]string `json:"annotations,omitempty"`
}

type claim struct {
	Metadata meta `json:"metadata"`
	Spec     struct {
		StorageClassName *string  `json:"storageClassName"`
		VolumeName       string   `json:"volumeName"`
		AccessModes      []string `json:"accessModes"`
		VolumeMode       string   `json:"volumeMode"`
		Resources        struct {
			Requests map[string]string `json:"requests"`
		} `json:"resources"`
	} `json:"spec"`
	Status struct {
		Phase string `json:"phase"`
	} `json:"status"`
}

type volume struct {
	Metadata meta `json:"metadata"`
	Spec     struct {
		ReclaimPolicy string `json:"persistentVolumeReclaimPolicy"`
		Local         *struct {
			Path string `json:"path"`
		} `json:"local"`
	} `json:"spec"`
	Status struct {
		Phase string `json:"phase"`
	} `json:"status"`
}

type class struct {
	Metadata    meta   `json:"metadata"`
	Provisioner string `json:"provisioner"`
}

type client struct {
	server string
	http   *http.Client
}

func (c *client) do(method, path string, body any, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.server+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode >= 300 {
		return resp.StatusCode, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(data)))
	}
	if out != nil {
		return resp.StatusCode, json.Unmarshal(data, out)
	}
	return resp.StatusCode, nil
}

func main() {
	server := flag.String("server", "", "API server URL")
	ca := flag.String("ca", "", "CA certificate of the API server")
	cert := flag.String("cert", "", "client certificate")
	key := flag.String("key", "", "client key")
	name := flag.String("provisioner", "e2e.kandev.dev/real-node", "provisioner name of our StorageClasses")
	node := flag.String("node", "", "the node every volume is on")
	dir := flag.String("dir", "", "directory of the volumes")
	interval := flag.Duration("interval", time.Second, "how often to look")
	flag.Parse()
	if *server == "" || *node == "" || *dir == "" {
		log.Fatal("-server, -node and -dir are required")
	}
	pair, err := tls.LoadX509KeyPair(*cert, *key)
	if err != nil {
		log.Fatal(err)
	}
	pool := x509.NewCertPool()
	pem, err := os.ReadFile(*ca)
	if err != nil || !pool.AppendCertsFromPEM(pem) {
		log.Fatalf("cannot read CA %s: %v", *ca, err)
	}
	c := &client{server: strings.TrimRight(*server, "/"), http: &http.Client{
		Timeout:   15 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}},
	}}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		log.Fatal(err)
	}
	log.Printf("provisioner %s watching claims (node %s, volumes in %s)", *name, *node, *dir)
	for {
		if err := pass(c, *name, *node, *dir); err != nil {
			log.Printf("error: %v", err)
		}
		time.Sleep(*interval)
	}
}

func pass(c *client, name, node, dir string) error {
	var classes struct{ Items []class }
	if _, err := c.do("GET", "/apis/storage.k8s.io/v1/storageclasses", nil, &classes); err != nil {
		return err
	}
	ours := map[string]bool{}
	for _, sc := range classes.Items {
		if sc.Provisioner == name {
			ours[sc.Metadata.Name] = true
		}
	}
	var claims struct{ Items []claim }
	if _, err := c.do("GET", "/api/v1/persistentvolumeclaims", nil, &claims); err != nil {
		return err
	}
	for _, pvc := range claims.Items {
		sc := pvc.Spec.StorageClassName
		if sc == nil || !ours[*sc] || pvc.Spec.VolumeName != "" || pvc.Metadata.DeletionTimestamp != nil || pvc.Status.Phase != "Pending" {
			continue
		}
		if err := provision(c, name, node, dir, &pvc); err != nil {
			log.Printf("claim %s/%s: %v", pvc.Metadata.Namespace, pvc.Metadata.Name, err)
		}
	}
	var volumes struct{ Items []volume }
	if _, err := c.do("GET", "/api/v1/persistentvolumes", nil, &volumes); err != nil {
		return err
	}
	for _, pv := range volumes.Items {
		if pv.Metadata.Annotations[provisionedBy] != name || pv.Spec.ReclaimPolicy != "Delete" ||
			(pv.Status.Phase != "Released" && pv.Status.Phase != "Failed") || pv.Spec.Local == nil {
			continue
		}
		path := filepath.Clean(pv.Spec.Local.Path)
		if filepath.Dir(path) == filepath.Clean(dir) {
			if err := os.RemoveAll(path); err != nil {
				log.Printf("volume %s: %v", pv.Metadata.Name, err)
				continue
			}
		}
		if code, err := c.do("DELETE", "/api/v1/persistentvolumes/"+pv.Metadata.Name, nil, nil); err != nil && code != 404 {
			log.Printf("volume %s: %v", pv.Metadata.Name, err)
			continue
		}
		log.Printf("deleted volume %s (%s)", pv.Metadata.Name, path)
	}
	return nil
}

func provision(c *client, name, node, dir string, pvc *claim) error {
	pvName := "pvc-" + pvc.Metadata.UID
	path := filepath.Join(dir, pvName)
	if err := os.MkdirAll(path, 0o777); err != nil {
		return err
	}
	if err := os.Chmod(path, 0o777); err != nil { // the umask took some bits
		return err
	}
	storage := pvc.Spec.Resources.Requests["storage"]
	if storage == "" {
		storage = "1Gi"
	}
	modes := pvc.Spec.AccessModes
	if len(modes) == 0 {
		modes = []string{"ReadWriteOnce"}
	}
	mode := pvc.Spec.VolumeMode
	if mode == "" {
		mode = "Filesystem"
	}
	pv := map[string]any{
		"apiVersion": "v1",
		"kind":       "PersistentVolume",
		"metadata": map[string]any{
			"name":        pvName,
			"annotations": map[string]string{provisionedBy: name},
		},
		"spec": map[string]any{
			"capacity":                      map[string]string{"storage": storage},
			"accessModes":                   modes,
			"volumeMode":                    mode,
			"storageClassName":              *pvc.Spec.StorageClassName,
			"persistentVolumeReclaimPolicy": "Delete",
			"local":                         map[string]string{"path": path},
			"nodeAffinity": map[string]any{"required": map[string]any{"nodeSelectorTerms": []any{
				map[string]any{"matchExpressions": []any{map[string]any{
					"key": "kubernetes.io/hostname", "operator": "In", "values": []string{node},
				}}},
			}}},
			"claimRef": map[string]string{
				"apiVersion": "v1", "kind": "PersistentVolumeClaim",
				"namespace": pvc.Metadata.Namespace, "name": pvc.Metadata.Name, "uid": pvc.Metadata.UID,
			},
		},
	}
	code, err := c.do("POST", "/api/v1/persistentvolumes", pv, nil)
	if code == 409 {
		return nil // already provisioned, binding in progress
	}
	if err != nil {
		return err
	}
	log.Printf("provisioned %s for claim %s/%s (%s)", pvName, pvc.Metadata.Namespace, pvc.Metadata.Name, path)
	return nil
}
