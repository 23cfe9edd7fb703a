// Command fn is the fan-in sample's functions, one binary with three roles
// (the first argument):
//
//	receive  the order (the session input) -> one task per check in bucket
//	         "tasks" (an Immediate trigger runs check for each)
//	check    one check of the order -> its verdict in bucket "checks"
//	confirm  all three verdicts (a BySet trigger fires once payment, stock
//	         and shipping are all present) -> the decision in "output"
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// Order is the session input.
type Order struct {
	ID      string  `json:"id"`
	Amount  float64 `json:"amount"`
	Items   int     `json:"items"`
	Country string  `json:"country"`
}

// Verdict is one check's answer.
type Verdict struct {
	OK     bool   `json:"ok"`
	Reason string `json:"reason"`
}

var checks = []string{"payment", "stock", "shipping"}

func receive(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
	var o Order
	if err := json.Unmarshal(inv.Objects[0].Bytes(), &o); err != nil {
		return nil, fmt.Errorf("the input must be an order as JSON: %w", err)
	}
	for _, c := range checks {
		if err := ziptrail.SendObject(ctx, "tasks", c, inv.Objects[0].Bytes(), nil); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

func check(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
	task := inv.Objects[0]
	var o Order
	if err := json.Unmarshal(task.Bytes(), &o); err != nil {
		return nil, err
	}
	var v Verdict
	switch task.Key {
	case "payment":
		v = Verdict{o.Amount > 0 && o.Amount <= 1000, fmt.Sprintf("amount %.2f (limit 1000)", o.Amount)}
	case "stock":
		v = Verdict{o.Items <= 10, fmt.Sprintf("%d items (10 in stock)", o.Items)}
	case "shipping":
		v = Verdict{o.Country != "", "ships to " + o.Country}
	default:
		return nil, fmt.Errorf("unknown check %q", task.Key)
	}
	out, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return nil, ziptrail.SendObject(ctx, "checks", task.Key, out, nil)
}

func confirm(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
	verdicts := map[string]Verdict{}
	approved := true
	for _, c := range checks {
		obj := inv.Object("checks", c)
		if obj == nil {
			return nil, fmt.Errorf("check %s missing", c)
		}
		var v Verdict
		if err := json.Unmarshal(obj.Bytes(), &v); err != nil {
			return nil, err
		}
		verdicts[c] = v
		approved = approved && v.OK
	}
	out, err := json.Marshal(map[string]any{"approved": approved, "checks": verdicts})
	if err != nil {
		return nil, err
	}
	return nil, ziptrail.SendObject(ctx, "output", "result", out, nil)
}

func main() {
	roles := map[string]ziptrail.Handler{"receive": receive, "check": check, "confirm": confirm}
	if len(os.Args) != 2 || roles[os.Args[1]] == nil {
		log.Fatalf("usage: fn receive|check|confirm")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := ziptrail.Serve(ctx, roles[os.Args[1]]); err != nil {
		log.Fatal(err)
	}
}
