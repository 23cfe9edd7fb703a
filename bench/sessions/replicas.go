package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The replicas' ports, the same on each replica's address (as pods of one
// Deployment): picked once, since the sidecars keep the control address
// across cases.
var metricsPort, probePort, controlPort, gatewayPort, gatewayGRPCPort, inputsPort string

// replicaIP is replica i's address, its engine identity (its "pod IP").
func replicaIP(i int) string { return fmt.Sprintf("127.0.0.%d", i+2) }

func listenLoopback() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

func pickPorts() error {
	var ports []string
	var lns []net.Listener
	for range 6 {
		ln, err := net.Listen("tcp", replicaIP(0)+":0")
		if err != nil {
			return err
		}
		lns = append(lns, ln)
		ports = append(ports, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	}
	for _, ln := range lns {
		ln.Close()
	}
	metricsPort, probePort, controlPort, gatewayPort, gatewayGRPCPort, inputsPort = ports[0], ports[1], ports[2], ports[3], ports[4], ports[5]
	return nil
}

// replica is one operator process, pinned to its core.
type replica struct {
	id   string // its address and engine identity
	core int
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed once the process exited
}

func (r *replica) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func (r *replica) pid() int { return r.cmd.Process.Pid }

// leases are the bucket Leases' timing (the chart's defaults unless set).
type leases struct{ duration, renew, retry time.Duration }

// startReplicas runs n operator processes with --engine-buckets, replica
// i on core i (taskset -c i: its threads never run elsewhere, and Go's
// GOMAXPROCS follows the affinity mask, 1).
func (c *cluster) startReplicas(n, buckets int, checkpointKey string, l leases) []*replica {
	var rs []*replica
	for i := range n {
		ip := replicaIP(i)
		r := &replica{id: ip, core: i % numCPU(), log: filepath.Join(c.dir, fmt.Sprintf("%s-%s.log", checkpointKey[strings.LastIndexByte(checkpointKey, ':')+1:], ip))}
		args := []string{"-c", strconv.Itoa(r.core), c.opBin, "--kubeconfig", c.kubeconfig,
			"--engine-buckets=" + strconv.Itoa(buckets), "--engine-identity=" + ip,
			"--engine-lease-duration=" + l.duration.String(), "--engine-renew-deadline=" + l.renew.String(), "--engine-retry-period=" + l.retry.String(),
			"--leader-elect=true", "--leader-election-namespace=" + systemNS,
			"--metrics-bind-address=" + ip + ":" + metricsPort, "--health-probe-bind-address=" + ip + ":" + probePort,
			"--control-bind-address=" + ip + ":" + controlPort, "--gateway-bind-address=" + ip + ":" + gatewayPort,
			"--gateway-grpc-bind-address=" + ip + ":" + gatewayGRPCPort,
			"--inputs-bind-address=" + ip + ":" + inputsPort, "--inputs-advertise-address=" + ip + ":" + inputsPort,
			"--redis-addr=" + c.redis.Addr, "--checkpoint-key=" + checkpointKey,
			// One namespace at ~250 sessions/s (~500 gateway requests/s):
			// the per-namespace limits' defaults would refuse most of it.
			"--limit-requests-per-second=0", "--limit-sessions-per-namespace=0"}
		r.cmd = exec.Command("taskset", args...) // taskset execs the operator: same pid
		r.cmd.Env = append(os.Environ(), "POD_NAMESPACE="+systemNS)
		f, err := os.Create(r.log)
		if err != nil {
			c.tb.Fatal(err)
		}
		r.cmd.Stdout, r.cmd.Stderr = f, f
		if err := r.cmd.Start(); err != nil {
			c.tb.Fatal(err)
		}
		f.Close()
		r.done = make(chan struct{})
		go func() { _ = r.cmd.Wait(); close(r.done) }()
		c.tb.Cleanup(func() { r.stop() })
		rs = append(rs, r)
	}
	return rs
}

// stop ends the replica as a rollout would (SIGTERM: last checkpoint,
// Leases released).
func (r *replica) stop() {
	if r.exited() {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
}

// affinity is the replica's CPU list as the kernel holds it.
func (r *replica) affinity() string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", r.pid()))
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// metrics scrapes the replica's /metrics: each sample's value, summed
// over its labels.
func (r *replica) metrics() map[string]float64 {
	out := map[string]float64{}
	resp, err := http.Get("http://" + r.id + ":" + metricsPort + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if l == "" || l[0] == '#' {
			continue
		}
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		name := f[0]
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
		}
		if v, err := strconv.ParseFloat(f[1], 64); err == nil {
			out[name] += v
		}
	}
	return out
}

// settle waits until the buckets are spread evenly (ziptrail_engine_buckets_owned).
func (c *cluster) settle(rs []*replica, buckets int, deadline time.Time) {
	share := buckets / len(rs)
	for {
		ok := true
		var got []float64
		for _, r := range rs {
			v, found := r.metrics()["ziptrail_engine_buckets_owned"]
			got = append(got, v)
			ok = ok && found && int(v) == share
		}
		if ok {
			return
		}
		for _, r := range rs {
			if r.exited() {
				c.tb.Fatalf("replica %s exited; its log: %s\n%s", r.id, r.log, tailFile(r.log, 30))
			}
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("the %d buckets did not spread %d each over %d replicas: %v", buckets, share, len(rs), got)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(string(b), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
