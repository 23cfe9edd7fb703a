// Command ziptrail is the developer CLI: it runs ziptrail on one machine.
//
//	ziptrail demo                       run the word count sample on the local cluster
//	ziptrail local up|down|status       run the local cluster
//	ziptrail run WORKFLOW --input FILE  run a session, show its progress and result
//	ziptrail sessions [WORKFLOW]        list sessions with their state
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

const usage = `usage: ziptrail <command>

commands:
  demo [--input FILE]  start the local cluster, run the MapReduce word count
                       sample (examples/wordcount) on FILE (default LICENSE),
                       check the result against a plain count, tear down
  local up             run the local cluster (API server, operator, pods in
                       network namespaces) in the foreground until Ctrl-C
  local down           remove what a crashed 'local up' left behind
  local status         list the local cluster's pods
  run WORKFLOW [--input FILE|-] [-n NAMESPACE] [-q]
                       start a session of WORKFLOW through the session gateway
                       of the running 'local up' (or --gateway URL), print its
                       progress to stderr and its result to stdout
  sessions [WORKFLOW] [-n NAMESPACE]
                       list the sessions of a namespace (or of one workflow),
                       newest first, with state, invocations and duration
  explain --size 4GiB [--fast-capacity 1GiB] [--worker-memory 3GiB]
          [--budget DOLLARS | --deadline DURATION] [--calibration FILE] [-o table|json]
                       plan a shuffle with the Locus model: the chosen method,
                       parallelism, worker memory and rounds, predicted time
                       and cost, and every alternative's prediction
  calibrate (--local | --redis HOST:PORT --s3-endpoint HOST:PORT --s3-bucket B ...)
            [-o FILE] [--configmap NAMESPACE/NAME] [--duration-per-point 2s] [--quick]
                       measure Redis, S3 and pod-memory pulls (bandwidth by
                       workers and object size, request rates at 10KB-100MB,
                       Redis server bandwidth), fit the shuffle model and write
                       the calibration that 'explain --calibration' reads
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "demo":
		err = runDemo(ctx, os.Args[2:], os.Stdout)
	case "local":
		err = runLocal(ctx, os.Args[2:], os.Stdout)
	case "run":
		err = runRun(ctx, os.Args[2:], os.Stdin, os.Stdout, os.Stderr)
	case "sessions":
		err = runSessions(ctx, os.Args[2:], os.Stdout, os.Stderr)
	case "explain":
		err = runExplain(os.Args[2:], os.Stdout, os.Stderr)
	case "calibrate":
		err = runCalibrate(ctx, os.Args[2:], os.Stdout, os.Stderr)
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "ziptrail: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "ziptrail %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
