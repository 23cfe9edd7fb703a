package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// CrossCheck is redis-benchmark's own view of the Redis column: one
// client (-c 1), SET then GET of the same size against the same
// redis-server, p50 of each; their sum is what a SET+GET costs Redis's
// own C client, to compare with the Go client's cell of the same run.
type CrossCheck struct {
	Size      int     `json:"size"`
	SetP50    float64 `json:"set_p50_seconds"`
	GetP50    float64 `json:"get_p50_seconds"`
	GoClient  float64 `json:"go_client_seconds"` // the Redis column's cell, same size
	Requests  int     `json:"requests"`
	Benchmark string  `json:"benchmark"` // the command line
}

// redisCrossCheck runs redis-benchmark for each measured 1-1 size
// (requests scaled to move ~200 MB, between 10 and 2,000).
func redisCrossCheck(addr string, results []Result) ([]CrossCheck, error) {
	host, port, _ := strings.Cut(addr, ":")
	var out []CrossCheck
	for _, r := range results {
		if r.Pattern != "1-1" || r.System != "Redis" {
			continue
		}
		n := min(2000, max(10, 200_000_000/r.Size))
		args := []string{"-h", host, "-p", port, "-c", "1", "-n", strconv.Itoa(n), "-d", strconv.Itoa(r.Size), "-t", "set,get", "--csv"}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		b, err := exec.CommandContext(ctx, "redis-benchmark", args...).Output()
		cancel()
		if err != nil {
			return out, fmt.Errorf("redis-benchmark %s: %w", strings.Join(args, " "), err)
		}
		rows, err := csv.NewReader(strings.NewReader(string(b))).ReadAll()
		if err != nil {
			return out, fmt.Errorf("redis-benchmark's CSV: %w", err)
		}
		c := CrossCheck{Size: r.Size, GoClient: r.Seconds, Requests: n, Benchmark: "redis-benchmark " + strings.Join(args, " ")}
		for _, row := range rows {
			if len(row) < 5 {
				continue
			}
			ms, err := strconv.ParseFloat(row[4], 64) // p50_latency_ms
			if err != nil {
				continue
			}
			switch row[0] {
			case "SET":
				c.SetP50 = ms / 1e3
			case "GET":
				c.GetP50 = ms / 1e3
			}
		}
		if c.SetP50 == 0 || c.GetP50 == 0 {
			return out, fmt.Errorf("redis-benchmark printed no SET/GET p50: %q", b)
		}
		out = append(out, c)
	}
	return out, nil
}

func printCrossCheck(cs []CrossCheck) {
	if len(cs) == 0 {
		return
	}
	fmt.Println("\nThe Redis column cross-checked with redis-benchmark -c 1 (same redis-server, same run):")
	fmt.Println("\n| size | SET p50 | GET p50 | SET+GET | Go client's SET+GET (table) | Go client / redis-benchmark |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, c := range cs {
		sum := c.SetP50 + c.GetP50
		fmt.Printf("| %s | %s | %s | %s | %s | %.2f× |\n", human(c.Size), dur(c.SetP50), dur(c.GetP50), dur(sum), dur(c.GoClient), c.GoClient/sum)
	}
}
