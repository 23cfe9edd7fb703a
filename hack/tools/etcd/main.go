// Command etcd is the upstream etcd server, built from Go modules so that
// envtest has a real etcd without any download site.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
