// kandev-kstatus: kstatus's verdict (sigs.k8s.io/cli-utils/pkg/kstatus/status, the library
// Flux's health checks use) on each object of a JSON array read from stdin, one JSON line per
// object on stdout: {"status": "Current|InProgress|Failed|Terminating|Unknown", "message": …}.
// Used by tests/e2e_gitops.rs on the statuses the operator wrote.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	var objects []json.RawMessage
	if err := json.NewDecoder(os.Stdin).Decode(&objects); err != nil {
		fmt.Fprintf(os.Stderr, "kandev-kstatus: reading a JSON array of objects from stdin: %v\n", err)
		os.Exit(2)
	}
	out := json.NewEncoder(os.Stdout)
	for i, raw := range objects {
		object := &unstructured.Unstructured{}
		if err := object.UnmarshalJSON(raw); err != nil {
			fmt.Fprintf(os.Stderr, "kandev-kstatus: object %d: %v\n", i, err)
			os.Exit(2)
		}
		result, err := status.Compute(object)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kandev-kstatus: object %d: %v\n", i, err)
			os.Exit(1)
		}
		if err := out.Encode(verdict{Status: result.Status.String(), Message: result.Message}); err != nil {
			os.Exit(1)
		}
	}
}
