// Command activator-ext is Knative Serving's activator with ziptrail's layer
// (internal/dataplane/activatorext). It is composed from knative.dev/serving's
// pkg/activator packages as Knative's own cmd/activator composes them — same
// environment, ports, config maps and handler chain — with two additions:
//
//   - around the activation handler, activatorext.Handler keeps the objects
//     a request references (header Ziptrail-Refs) alive at their producers
//     while the request waits for a cold start;
//   - around the throttler, activatorext.LocalityThrottler sends a request to
//     a ready pod on its producer's node (header Ziptrail-Producer-Node) when
//     there is one, and keeps Knative's choice otherwise.
//
// The keep-alive opens references with their namespace's keys, which it
// reads from the operator's control service (GetKeys at
// $ZIPTRAIL_OPERATOR_ADDR), presenting the activator's projected
// service-account token; the operator allow-lists the activator's
// ServiceAccount (--control-key-readers), so the activator needs no access
// to Secrets.
//
// A request without ziptrail headers takes exactly Knative's path, so the
// image can replace the activator's (see the chart's activatorExt values).
package main

import "github.com/ziptrail/ziptrail/internal/dataplane/activatorext/app"

func main() { app.Main() }
