package calibrate

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// sdkDriverPy drives the Python SDK for the sidecar-path points
// (sdkdriver.py documents its commands).
//
//go:embed sdkdriver.py
var sdkDriverPy []byte

// pyProcess is a Python process answering one JSON line per command.
type pyProcess struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once it exited
	mu   sync.Mutex
	in   io.WriteCloser
	out  *bufio.Scanner
	log  *lockedWriter
}

// pyResult is a command's answer.
type pyResult struct {
	CPU      float64 `json:"cpu"`
	Seconds  float64 `json:"seconds"`
	Requests int     `json:"requests"`
	Bytes    float64 `json:"bytes"`
	Error    string  `json:"error"`
}

// startPython runs script (written to dir) with python and args, env
// added; tb stops it.
func startPython(tb *servers.ProcessTB, python, dir, name string, script []byte, env []string, args ...string) *pyProcess {
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, script, 0o600); err != nil {
		tb.Fatal(err)
	}
	p := &pyProcess{cmd: exec.Command(python, append([]string{path}, args...)...), log: &lockedWriter{w: new(bytes.Buffer)}}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = p.log
	var err error
	if p.in, err = p.cmd.StdinPipe(); err != nil {
		tb.Fatal(err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	p.out = bufio.NewScanner(stdout)
	if err := p.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	p.done = make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	tb.Cleanup(func() {
		_ = p.in.Close()
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// do sends one command and reads its answer.
func (p *pyProcess) do(cmd map[string]any) (pyResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, _ := json.Marshal(cmd)
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		return pyResult{}, fmt.Errorf("python: %w\n%s", err, p.log.String())
	}
	if !p.out.Scan() {
		return pyResult{}, fmt.Errorf("python exited: %v\n%s", p.out.Err(), p.log.String())
	}
	var r pyResult
	if err := json.Unmarshal(p.out.Bytes(), &r); err != nil {
		return pyResult{}, fmt.Errorf("python answered %q: %w", p.out.Text(), err)
	}
	if r.Error != "" {
		return r, fmt.Errorf("python: %s", r.Error)
	}
	return r, nil
}

// startPythonSDK runs sdkdriver.py on the sidecar-path pods a and b.
func (s *sidecars) startPythonSDK(python string) (p *pyProcess, err error) {
	err = s.tb.Do(func() {
		p = startPython(s.tb, python, s.tb.TempDir(), "sdkdriver.py", sdkDriverPy, nil, s.a.socket, s.a.shm, s.b.socket, s.b.shm)
	})
	return p, err
}

// pythonPoint is sidecarPoint with the Python SDK as the function: the
// same stores, directions and sizes, Workers threads of one Python
// process (sdkdriver.py), each moving its batch of objects (size·k ≤
// 32 MB) per timed command, with the CPU of the server, both sidecars
// and the Python process around every timed batch:
//
//   - s3/redis write: tier_put; then (timed apart, op "delete")
//     tier_delete of the batch;
//   - s3/redis read: tier_get (each copied out of the shared memory, as
//     the shuffle library reads) of objects put once, untimed;
//   - pod write: put into a's own store (then freed, untimed);
//   - pod read: b's get of objects a put (untimed).
//
// The samples go to Measurements.PythonSDK; the fit takes the Python
// process's CPU from them (model.Params.SDKCPU["python"]).
func (r *runner) pythonPoint(ctx context.Context, store, op string, size float64) (string, error) {
	s, py := r.sidecar, r.python
	w := r.cfg.Sidecar.Workers
	per := max(1, int(32*model.MB/size))
	tier := "slow"
	if store == Redis {
		tier = "fast"
	}
	prefix := fmt.Sprintf("py-%s-%s-%d", store, strings.ReplaceAll(FormatSize(size), " ", ""), r.seq.Add(1))
	base := func(op string) map[string]any {
		return map[string]any{"op": op, "tier": tier, "size": size, "count": per, "workers": w, "prefix": prefix}
	}
	pid, hasServer := r.cfg.ServerPIDs[store]
	newSample := func(op string) CPUSample {
		cs := CPUSample{Store: store, Op: op, Size: size, Workers: w, ServerCPU: -1}
		if hasServer {
			cs.ServerCPU = 0
		}
		return cs
	}
	measure := func(cs *CPUSample, cmd map[string]any) error {
		var srv0, srv1 float64
		var err error
		if hasServer {
			if srv0, err = ProcessCPU(pid); err != nil {
				return err
			}
		}
		sc0, err := s.cpu()
		if err != nil {
			return err
		}
		res, err := py.do(cmd)
		if err != nil {
			return err
		}
		sc1, err := s.cpu()
		if err != nil {
			return err
		}
		if hasServer {
			if srv1, err = ProcessCPU(pid); err != nil {
				return err
			}
			cs.ServerCPU += srv1 - srv0
		}
		cs.SidecarCPU += sc1 - sc0
		cs.ClientCPU += res.CPU
		cs.Seconds += res.Seconds
		cs.Requests += res.Requests
		cs.Bytes += res.Bytes
		return nil
	}
	sample, del := newSample(op), newSample(Delete)
	withDeletes := store != Pod && op == Write
	if store != Pod && op == Read { // the objects read, once
		if _, err := py.do(base("tier_put")); err != nil {
			return "", err
		}
		defer func() { _, _ = py.do(base("tier_delete")) }()
	}
	for sample.Seconds < r.cfg.DurationPerPoint.Seconds() || sample.Requests == 0 {
		var err error
		switch {
		case store != Pod && op == Write:
			if err = measure(&sample, base("tier_put")); err == nil {
				err = measure(&del, base("tier_delete"))
			}
		case store != Pod:
			err = measure(&sample, base("tier_get"))
		case op == Write:
			if err = measure(&sample, base("put")); err == nil {
				_, err = py.do(base("free"))
			}
		default:
			if _, err = py.do(base("put")); err == nil {
				err = measure(&sample, base("get"))
			}
		}
		if err != nil {
			return "", err
		}
		if err := ctx.Err(); err != nil {
			return "", err
		}
	}
	r.m.PythonSDK = append(r.m.PythonSDK, sample)
	deletes := ""
	if withDeletes {
		r.m.PythonSDK = append(r.m.PythonSDK, del)
		deletes = fmt.Sprintf("; deleting them: %.2fs, Python %s per object", del.Seconds, FormatCPUSeconds(del.ClientCPU/float64(del.Requests)))
	}
	return fmt.Sprintf("%s in %.2fs, %d requests; CPU: sidecars %.2fs, Python SDK %.2fs (%s, %s per request)%s",
		FormatRate(sample.Bytes/sample.Seconds), sample.Seconds, sample.Requests, sample.SidecarCPU, sample.ClientCPU,
		FormatCPUPerByte(sample.ClientCPU/sample.Bytes), FormatCPUSeconds(sample.ClientCPU/float64(sample.Requests)), deletes), nil
}

// pythonWithSDK says whether python imports the ziptrail SDK (the
// Python points need it: `pip install ./sdk/python`).
func pythonWithSDK(python string) error {
	out, err := exec.Command(python, "-c", "import ziptrail").CombinedOutput()
	if err != nil {
		return errors.New(strings.TrimSpace(string(out)) + ": " + err.Error())
	}
	return nil
}
