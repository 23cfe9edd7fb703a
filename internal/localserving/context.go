package localserving

import (
	"context"
	"net/http"
)

func contextWithTarget(req *http.Request, target string) context.Context {
	return context.WithValue(req.Context(), targetKey{}, target)
}
