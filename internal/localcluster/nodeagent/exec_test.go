package nodeagent_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
)

// kubectl exec through the API server runs in the container's namespaces
// (its network: a pod on node 0 reaches a pod on node 1 by IP, routed by
// the host) and reports the command's exit code.
func TestExecAcrossNodes(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	create(t, echoPod(ns, "left", nodes[0].Name))
	create(t, echoPod(ns, "right", nodes[1].Name))
	waitReady(t, ns, "left")
	right := waitReady(t, ns, "right")

	stdout, stderr, err := execIn(ns, "left", []string{"python3", "-c", fmt.Sprintf(
		"import urllib.request; print(urllib.request.urlopen('http://%s:8080/x', timeout=5).read().decode(), end='')", right.Status.PodIP)})
	g.Expect(err).NotTo(HaveOccurred(), "stderr: %s", stderr)
	g.Expect(stdout).To(Equal(fmt.Sprintf("echo from right (%s) /x\n", right.Status.PodIP)))

	stdout, _, err = execIn(ns, "left", []string{"sh", "-c", "cat /etc/resolv.conf; exit 3"})
	g.Expect(stdout).To(ContainSubstring("search " + ns + ".svc.cluster.local"))
	var exitErr utilexec.ExitError
	g.Expect(err).To(HaveOccurred())
	g.Expect(errorsAs(err, &exitErr)).To(BeTrue(), "%T %v", err, err)
	g.Expect(exitErr.ExitStatus()).To(Equal(3))

	// A command killed by a signal exits 128+signal, as a runtime reports
	// it (not -1, which kubectl refuses: "invalid exit code value").
	_, _, err = execIn(ns, "left", []string{"sh", "-c", "kill -9 $$"})
	g.Expect(errorsAs(err, &exitErr)).To(BeTrue(), "%T %v", err, err)
	g.Expect(exitErr.ExitStatus()).To(Equal(137))
}

func execIn(ns, pod string, cmd []string) (string, string, error) {
	req := client.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "echo", Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(restConfig, "POST", req.URL())
	if err != nil {
		return "", "", err
	}
	var out, errOut bytes.Buffer
	err = ex.StreamWithContext(context.Background(), remotecommand.StreamOptions{Stdout: &out, Stderr: &errOut})
	return out.String(), strings.TrimSpace(errOut.String()), err
}
