// Package archtest holds the layout's rules as tests: which wing of the
// house each package belongs to (the operator, the data plane, the local
// cluster, tooling, the shared leaves, the Go SDK, ...) and which wings may
// import which, checked against `go list -deps -json ./...` (production
// imports only: test files do not count).
//
// The table of wings, the rules and the known exceptions are in
// layout_test.go; that file is the one to edit when a package moves or a
// new one is added. Run the checks with
//
//	go test ./internal/archtest/
//
// and see which package is in which wing with
//
//	go test -v -run TestEveryPackageHasAWing ./internal/archtest/
//
// The target layout and its rules are issue 34's ("The house in four
// wings").
package archtest
