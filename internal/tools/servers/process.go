package servers

import (
	"fmt"
	"os"
	"sync"
)

// ProcessTB is the TB of a process that is not a test (benchmark
// commands, `ziptrail calibrate --local`, test harness commands): Fatal
// panics with a Fatal error, which Do turns into a returned error;
// Cleanup's functions and the temp dirs are undone by Close.
type ProcessTB struct {
	// Dir is where TempDir makes directories (default: the system's).
	Dir string
	// ExitOnFatal makes Fatal print its message, Close and end the
	// process with status 1, from any goroutine (benchmark commands),
	// instead of panicking.
	ExitOnFatal bool

	mu       sync.Mutex
	cleanups []func()
	dirs     []string
}

// Fatal is what a ProcessTB's Fatal panics with.
type Fatal string

func (f Fatal) Error() string { return string(f) }

func (*ProcessTB) Helper() {}

func (p *ProcessTB) Fatal(args ...any) { p.fail(Fatal(fmt.Sprint(args...))) }

func (p *ProcessTB) Fatalf(format string, args ...any) { p.fail(Fatal(fmt.Sprintf(format, args...))) }

func (p *ProcessTB) fail(f Fatal) {
	if p.ExitOnFatal {
		fmt.Fprintln(os.Stderr, "fatal:", f)
		p.Close()
		os.Exit(1)
	}
	panic(f)
}

// TempDir makes a directory that Close removes.
func (p *ProcessTB) TempDir() string {
	d, err := os.MkdirTemp(p.Dir, "ziptrail-")
	if err != nil {
		p.Fatal(err)
	}
	p.mu.Lock()
	p.dirs = append(p.dirs, d)
	p.mu.Unlock()
	return d
}

// Cleanup registers f for Close.
func (p *ProcessTB) Cleanup(f func()) {
	p.mu.Lock()
	p.cleanups = append(p.cleanups, f)
	p.mu.Unlock()
}

// Close runs the cleanups, last first, and removes the temp dirs; a
// second Close does nothing.
func (p *ProcessTB) Close() {
	p.mu.Lock()
	cleanups, dirs := p.cleanups, p.dirs
	p.cleanups, p.dirs = nil, nil
	p.mu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	for _, d := range dirs {
		_ = os.RemoveAll(d)
	}
}

// Do runs f and returns a Fatal it raised as an error.
func (p *ProcessTB) Do(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			fe, ok := r.(Fatal)
			if !ok {
				panic(r)
			}
			err = fe
		}
	}()
	f()
	return nil
}
