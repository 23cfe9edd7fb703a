// Command putget is the Go SDK's runnable example: `putget put FILE`
// buffers a file in its pod's sidecar and prints the reference;
// `putget get REF` fetches it through another pod's sidecar and prints its
// size, SHA-256 and whether it was mapped rather than copied. See
// sdk/go/README.md for running it against two local sidecars.
package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"

	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

func main() {
	if len(os.Args) != 3 || (os.Args[1] != "put" && os.Args[1] != "get") {
		fmt.Fprintln(os.Stderr, "usage: putget put FILE | putget get REF")
		os.Exit(2)
	}
	if err := run(context.Background(), os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cmd, arg string) error {
	if cmd == "put" {
		data, err := os.ReadFile(arg)
		if err != nil {
			return err
		}
		ref, err := ziptrail.Put(ctx, data, 1)
		if err != nil {
			return err
		}
		fmt.Println(ref)
		return nil
	}
	obj, err := ziptrail.Get(ctx, arg)
	if err != nil {
		return err
	}
	defer obj.Close()
	fmt.Printf("%d bytes sha256 %x mapped=%t from %s\n", obj.Size, sha256.Sum256(obj.Bytes()), obj.Mapped(), obj.Source)
	return nil
}
