package main

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// memSample is one reading of a process's memory, in bytes. RSS counts
// every resident page the process maps, PSS divides shared pages among the
// processes sharing them; the anon/file split separates heap and stacks
// from the touched parts of the binary (and libraries).
type memSample struct {
	RSS     int64 `json:"rss"`
	RSSAnon int64 `json:"rss_anon"`
	RSSFile int64 `json:"rss_file"`
	HWM     int64 `json:"hwm"` // peak RSS so far
	PSS     int64 `json:"pss"` // -1: smaps_rollup unavailable
	PSSAnon int64 `json:"pss_anon"`
	PSSFile int64 `json:"pss_file"`
}

// readMem reads /proc/PID/status and, where the kernel has it (4.14+),
// /proc/PID/smaps_rollup.
func readMem(pid int) (memSample, error) {
	status, err := readKB(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memSample{}, err
	}
	m := memSample{RSS: status["VmRSS"], RSSAnon: status["RssAnon"], RSSFile: status["RssFile"] + status["RssShmem"],
		HWM: status["VmHWM"], PSS: -1, PSSAnon: -1, PSSFile: -1}
	rollup, err := readKB(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return m, nil
	case err != nil:
		return m, err
	}
	m.PSS, m.PSSAnon, m.PSSFile = rollup["Pss"], rollup["Pss_Anon"], rollup["Pss_File"]+rollup["Pss_Shmem"]
	return m, nil
}

// readKB parses "Key:   123 kB" lines into bytes; other lines are skipped.
func readKB(path string) (map[string]int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(rest)
		if !ok || len(fields) != 2 || fields[1] != "kB" {
			continue
		}
		if n, err := strconv.ParseInt(fields[0], 10, 64); err == nil {
			out[key] = n << 10
		}
	}
	return out, sc.Err()
}

// evictPageCache drops a binary's pages from the page cache, so that every
// start reads it the way a pod's first start on a node does (through
// readahead). Without this, how the linker happened to write the file
// (the size of the page-cache folios it left behind, which the kernel maps
// whole) moved the file-backed RSS by several MiB from one run to the next.
func evictPageCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil { // dirty pages cannot be dropped
		return err
	}
	const fadvDontNeed = 4 // POSIX_FADV_DONTNEED
	if _, _, errno := syscall.Syscall6(syscall.SYS_FADVISE64, f.Fd(), 0, 0, fadvDontNeed, 0, 0); errno != 0 {
		return fmt.Errorf("fadvise %s: %w", path, errno)
	}
	return nil
}
