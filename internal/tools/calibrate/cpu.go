package calibrate

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
)

// CPUSample is the CPU time spent during one timed measurement (a
// bandwidth point, a rate probe, the server point): by the store's server
// process (when calibrate can see it, Config.ServerPIDs) and by the
// calibrating process itself, which is the client side of every transfer —
// what a sidecar does for a worker — and, for pod pulls, both the producer
// and the consumer.
type CPUSample struct {
	Store    string  `json:"store"`
	Op       string  `json:"op"` // read, write, or "mixed" (the server point)
	Size     float64 `json:"size"`
	Workers  int     `json:"workers"`
	Requests int     `json:"requests"`
	Bytes    float64 `json:"bytes"`
	Seconds  float64 `json:"seconds"`
	// ServerCPU is the server process's CPU seconds (user + system), -1 if
	// not measured (no PID for the store; pod pulls have no server apart
	// from this process).
	ServerCPU float64 `json:"serverCPU"`
	// ClientCPU is this process's CPU seconds (every thread).
	ClientCPU float64 `json:"clientCPU"`
	// SidecarCPU is the queue-proxy-zl processes' CPU seconds (the
	// sidecar-path points; 0 in the others, which have no sidecar).
	SidecarCPU float64 `json:"sidecarCPU,omitempty"`
}

// Total is the sample's CPU: server (if measured) plus sidecars plus
// client.
func (s CPUSample) Total() float64 { return max(s.ServerCPU, 0) + s.SidecarCPU + s.ClientCPU }

// selfCPU is this process's CPU time (user + system, every thread) in
// seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// ProcessCPU is the CPU time (user + system, every thread) of process pid
// in seconds, from /proc/<pid>/stat (10 ms resolution).
func ProcessCPU(pid int) (float64, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	// the command name (field 2) is in parentheses and may hold spaces
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return float64(ut+st) / clockTicks, nil
}

// ListenerPID finds the process on this machine listening on addr
// (host:port, TCP): the socket's inode from /proc/net/tcp{,6}, then the
// process holding it among those whose /proc/<pid>/fd this user can read.
// `ziptrail calibrate --local` uses it for the redis-server and MinIO it
// started; a server behind a port-forward or in a pod of another node is
// not found (or is the forwarder, which is why calibrate does not look
// for the servers it did not start).
func ListenerPID(addr string) (int, error) {
	_, portS, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	port, err := strconv.ParseUint(portS, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("port %q: %w", portS, err)
	}
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			if len(fs) < 10 || fs[3] != "0A" { // 0A: LISTEN
				continue
			}
			j := strings.LastIndexByte(fs[1], ':')
			if p, err := strconv.ParseUint(fs[1][j+1:], 16, 16); err == nil && p == port && fs[9] != "0" {
				inodes["socket:["+fs[9]+"]"] = true
			}
		}
		fh.Close()
	}
	if len(inodes) == 0 {
		return 0, fmt.Errorf("no listening socket on port %d in /proc/net/tcp", port)
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(filepath.Join("/proc", p.Name(), "fd"))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join("/proc", p.Name(), "fd", fd.Name())); err == nil && inodes[l] {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("no readable process holds the socket listening on port %d", port)
}

// CPUFit is a store's fitted CPU cost in one direction and what it was
// fitted on.
type CPUFit struct {
	CPU model.CPUCost
	// ServerShare and SidecarShare are the server's and the sidecars'
	// parts of the CPU of the samples (0 to 1).
	ServerShare, SidecarShare float64
	// RMS is the root mean square relative residual.
	RMS     float64
	Samples int
}

// minCPUSample is the least CPU (seconds) a sample must show to be fitted:
// /proc's times tick at 10 ms.
const minCPUSample = 0.05

// FitCPU fits CPU = PerRequest·requests + PerByte·bytes to samples of one
// store and direction by least squares on the relative residual (each sample weighs the
// same whatever its size), both coefficients non-negative (a negative one
// is dropped and the other re-fitted). Samples with less than 50 ms of CPU
// are left out (the resolution of /proc's times).
func FitCPU(samples []CPUSample) (CPUFit, error) {
	var req, byt []float64
	var server, sidecar, total float64
	for _, s := range samples {
		y := s.Total()
		if y < minCPUSample || s.Requests < 1 || !(s.Bytes > 0) {
			continue
		}
		// weight 1/y: the fit is on (pred − y)/y
		req = append(req, float64(s.Requests)/y)
		byt = append(byt, s.Bytes/y)
		server += max(s.ServerCPU, 0)
		sidecar += s.SidecarCPU
		total += y
	}
	n := len(req)
	if n == 0 {
		return CPUFit{}, errors.New("no CPU samples of at least 50 ms")
	}
	y := ones(n)
	var c model.CPUCost
	if x, ok := leastSquares([][]float64{req, byt}, y); ok && x[0] >= 0 && x[1] >= 0 {
		c = model.CPUCost{PerRequest: x[0], PerByte: x[1]}
	} else {
		// one coefficient alone: the one with the smaller residual
		a := dot(req, y) / dot(req, req)
		b := dot(byt, y) / dot(byt, byt)
		if sse(req, a, y) < sse(byt, b, y) {
			c = model.CPUCost{PerRequest: a}
		} else {
			c = model.CPUCost{PerByte: b}
		}
	}
	var ss float64
	for i := range req {
		r := c.PerRequest*req[i] + c.PerByte*byt[i] - 1
		ss += r * r
	}
	return CPUFit{CPU: c, ServerShare: server / total, SidecarShare: sidecar / total, RMS: math.Sqrt(ss / float64(n)), Samples: n}, nil
}

func sse(x []float64, a float64, y []float64) float64 {
	var s float64
	for i := range x {
		d := a*x[i] - y[i]
		s += d * d
	}
	return s
}
