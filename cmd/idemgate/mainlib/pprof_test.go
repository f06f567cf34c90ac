package mainlib

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/health"
)

// The profiler is served only when serve --pprof asks for it.
func TestAdminServesPprofOnlyWhenAsked(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts adminOptions
		want int
	}{
		{"default", adminOptions{}, http.StatusNotFound},
		{"--pprof", adminOptions{pprof: true}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := adminHandler(prometheus.NewRegistry(), health.NewServer(), &readiness{}, "memory", tc.opts)
			for _, path := range []string{"/debug/pprof/", "/debug/pprof/allocs", "/debug/pprof/cmdline"} {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
				require.Equal(t, tc.want, rec.Code, path)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
			require.Equal(t, http.StatusOK, rec.Code, "the usual endpoints stay")
		})
	}
}
