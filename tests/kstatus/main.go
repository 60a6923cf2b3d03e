// Command kstatus prints what sigs.k8s.io/cli-utils/pkg/kstatus (the status library of Flux,
// kpt and `kubectl apply --prune`-style tools) computes for each object of a JSON list read
// from stdin: one JSON line per object, {"name", "status", "message"}.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
	input, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "reading stdin:", err)
		os.Exit(2)
	}
	// Kubernetes' JSON decoding: integers stay int64, as kstatus expects.
	var objects []interface{}
	if err := utiljson.Unmarshal(input, &objects); err != nil {
		fmt.Fprintln(os.Stderr, "reading a JSON list of objects from stdin:", err)
		os.Exit(2)
	}
	out := json.NewEncoder(os.Stdout)
	for _, item := range objects {
		object, ok := item.(map[string]interface{})
		if !ok {
			fmt.Fprintln(os.Stderr, "not an object:", item)
			os.Exit(2)
		}
		u := &unstructured.Unstructured{Object: object}
		result, err := status.Compute(u)
		if err != nil {
			fmt.Fprintln(os.Stderr, "computing the status of", u.GetName(), ":", err)
			os.Exit(1)
		}
		_ = out.Encode(map[string]string{
			"name":    u.GetName(),
			"status":  result.Status.String(),
			"message": result.Message,
		})
	}
}
