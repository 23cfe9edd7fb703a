// Command operator runs ziptrail's control plane: the Workflow, Bucket and
// Trigger reconcilers, and — on the elected leader only — the trigger engine
// with its dispatcher, the sidecars' control stream, the session gateway
// (Kubernetes authentication and authorization on every request) and the
// data-plane store of large session inputs. With --engine-buckets the
// engine is sharded instead: every replica runs the engine of the buckets
// it owns and serves the control stream and the gateway, sending other
// replicas' workflows to them (docs/sharding.md). The assembly is
// internal/operator/app's.
//
// The same binary runs the chart's hooks (`operator knative-config`,
// `operator knative-restore`, internal/operator/knativeconfig) and its
// same-node DaemonSet (`operator node-dir`).
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/ziptrail/ziptrail/internal/nodedir"
	"github.com/ziptrail/ziptrail/internal/operator/app"
	"github.com/ziptrail/ziptrail/internal/operator/knativeconfig"
	"github.com/ziptrail/ziptrail/internal/operator/podwebhook"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "node-dir":
			exit("node-dir", nodeDir(os.Args[2:]))
		default:
			if ok, err := knativeconfig.HookCommand(os.Args[1:]); ok {
				exit(os.Args[1], err)
			}
		}
	}
	var c app.Config
	c.Flags(flag.CommandLine)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	if err := app.Run(c); err != nil {
		fmt.Fprintf(os.Stderr, "operator: %v\n", err)
		os.Exit(1)
	}
}

// nodeDir runs `operator node-dir [--path DIR]`, the chart's same-node
// DaemonSet's container: prepare the node directory (nodedir.Prepare) and
// wait for SIGTERM.
func nodeDir(args []string) error {
	fs := flag.NewFlagSet("node-dir", flag.ExitOnError)
	path := fs.String("path", podwebhook.DefaultHostDir, "the node directory")
	_ = fs.Parse(args)
	if err := nodedir.Prepare(*path); err != nil {
		return err
	}
	fmt.Printf("operator node-dir: %s ready (mode %v)\n", *path, nodedir.Mode)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return nil
}

// exit ends a subcommand: status 1 with its error, else 0.
func exit(cmd string, err error) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "operator %s: %v\n", cmd, err)
		os.Exit(1)
	}
	os.Exit(0)
}
