package calibrate

import (
	"math"
	"net"
	"os"
	"testing"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
)

// TestFitCPU: samples made from known costs give those costs back; a
// negative coefficient is dropped; samples under 50 ms are left out.
func TestFitCPU(t *testing.T) {
	want := model.CPUCost{PerByte: 4e-9, PerRequest: 50e-6}
	var samples []CPUSample
	for _, s := range []struct {
		reqs int
		size float64
	}{{20000, 10e3}, {5000, 100e3}, {800, 1e6}, {90, 10e6}, {12, 100e6}, {1, 10e3}} {
		b := float64(s.reqs) * s.size
		cpu := want.Of(b, float64(s.reqs))
		samples = append(samples, CPUSample{Store: S3, Requests: s.reqs, Bytes: b, ServerCPU: 0.4 * cpu, ClientCPU: 0.6 * cpu})
	}
	f, err := FitCPU(samples)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(f.CPU.PerByte/want.PerByte-1) > 1e-6 || math.Abs(f.CPU.PerRequest/want.PerRequest-1) > 1e-6 || f.RMS > 1e-6 {
		t.Errorf("fit %+v, want %+v", f, want)
	}
	if f.Samples != 5 || math.Abs(f.ServerShare-0.4) > 1e-9 {
		t.Errorf("%d samples (want 5: the 50 µs one is left out), server share %v (want 0.4)", f.Samples, f.ServerShare)
	}
	// CPU that falls with requests at a fixed byte count fits a negative
	// per-request cost: dropped, the per-byte cost alone re-fitted
	f, err = FitCPU([]CPUSample{{Requests: 10, Bytes: 1e9, ClientCPU: 2}, {Requests: 1000, Bytes: 1e9, ClientCPU: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if f.CPU.PerRequest != 0 || !(f.CPU.PerByte > 1e-9 && f.CPU.PerByte < 2e-9) {
		t.Errorf("fit %+v: want per byte only, between 1 and 2 ns", f.CPU)
	}
	if _, err := FitCPU([]CPUSample{{Requests: 1, Bytes: 1, ClientCPU: 0.01}}); err == nil {
		t.Error("a fit of nothing but a 10 ms sample")
	}
}

// TestProcessCPU: this process's CPU from /proc, and the process that
// listens on a port (this one).
func TestProcessCPU(t *testing.T) {
	c, err := ProcessCPU(os.Getpid())
	if err != nil || c < 0 {
		t.Fatalf("ProcessCPU(self) = %v, %v", c, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pid, err := ListenerPID(ln.Addr().String())
	if err != nil || pid != os.Getpid() {
		t.Errorf("ListenerPID = %d, %v; want %d", pid, err, os.Getpid())
	}
	if _, err := ProcessCPU(-5); err == nil {
		t.Error("ProcessCPU of no process")
	}
}
