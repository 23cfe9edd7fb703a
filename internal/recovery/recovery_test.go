package recovery

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestRecoverCounts(t *testing.T) {
	func() {
		defer Recover("test", "sync")
		var m map[string]int
		m["x"] = 1 // a defect: nil map write
	}()
	if n := testutil.ToFloat64(Counter("test", "sync")); n != 1 {
		t.Errorf("counted %v, want 1", n)
	}
}

// TestGoSurvives: a panic on a goroutine started by Go ends that goroutine
// only (the test binary would die otherwise).
func TestGoSurvives(t *testing.T) {
	done := make(chan struct{})
	Go("test", "go", func() {
		defer close(done)
		panic("a defect reached by input")
	})
	<-done
}

func TestInterceptorsAnswerInternal(t *testing.T) {
	u := UnaryInterceptor("test")
	_, err := u(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x.Y/Unary"}, func(context.Context, any) (any, error) {
		panic("boom")
	})
	if status.Code(err) != codes.Internal {
		t.Fatalf("unary: %v, want Internal", err)
	}
	s := StreamInterceptor("test")
	err = s(nil, nil, &grpc.StreamServerInfo{FullMethod: "/x.Y/Stream"}, func(any, grpc.ServerStream) error { panic("boom") })
	if status.Code(err) != codes.Internal {
		t.Fatalf("stream: %v, want Internal", err)
	}
	if n := testutil.ToFloat64(Counter("test", "/x.Y/Unary")) + testutil.ToFloat64(Counter("test", "/x.Y/Stream")); n != 2 {
		t.Errorf("counted %v, want 2", n)
	}
}
