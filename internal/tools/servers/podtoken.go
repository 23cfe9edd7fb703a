package servers

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// TokenPodUID reads the pod UID the API server bound a token file to (its
// "kubernetes.io" claim, as Operator.PodToken writes it): the UID the
// directory puts in views, and the one a same-node sidecar's node socket
// is named after.
func TokenPodUID(file string) (string, error) {
	tok, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	parts := strings.Split(string(tok), ".")
	if len(parts) != 3 {
		return "", fmt.Errorf("token of %d parts", len(parts))
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", err
	}
	var claims struct {
		K8s struct {
			Pod struct{ UID string } `json:"pod"`
		} `json:"kubernetes.io"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil || claims.K8s.Pod.UID == "" {
		return "", fmt.Errorf("no pod UID in the token: %v", err)
	}
	return claims.K8s.Pod.UID, nil
}
