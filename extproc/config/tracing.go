package config

import (
	"fmt"
	"net"
	"time"
)

// Tracing is the tracing section of idemgate.yaml: OpenTelemetry spans for
// the guarded streams, exported over OTLP/gRPC. Absent (or without otlp)
// means off: the server then uses a no-op tracer and pays nothing per
// request.
type Tracing struct {
	OTLP *OTLP `yaml:"otlp"`
	// SampleRatio is the share of new traces sampled (0..1, default 1); a
	// request whose traceparent says sampled is always followed, so a
	// caller's sampling decision is kept (parent-based sampling).
	SampleRatio *float64 `yaml:"sample_ratio"`
	ServiceName string   `yaml:"service_name"`
}

// OTLP is the OTLP/gRPC collector idemgate exports spans to.
type OTLP struct {
	Endpoint string `yaml:"endpoint"` // host:port
	Insecure bool   `yaml:"insecure"` // plaintext gRPC (a local collector)
	Timeout  string `yaml:"timeout"`  // per export batch
}

// TracingSettings is the compiled tracing section. Enabled is false unless
// an OTLP endpoint is configured.
type TracingSettings struct {
	Enabled     bool
	Endpoint    string
	Insecure    bool
	Timeout     time.Duration
	SampleRatio float64
	ServiceName string
}

// Tracing defaults.
const (
	DefaultTracingServiceName = "idemgate"
	DefaultTracingTimeout     = 10 * time.Second
)

func (c *compiler) tracing(t Tracing) TracingSettings {
	s := TracingSettings{SampleRatio: 1, ServiceName: t.ServiceName}
	if s.ServiceName == "" {
		s.ServiceName = DefaultTracingServiceName
	}
	if t.SampleRatio != nil {
		s.SampleRatio = *t.SampleRatio
		if s.SampleRatio < 0 || s.SampleRatio > 1 {
			c.errorf(p("tracing", "sample_ratio"), "must be between 0 and 1, got %v", s.SampleRatio)
		}
	}
	if t.OTLP == nil {
		if t.SampleRatio != nil || t.ServiceName != "" {
			// Settings with no exporter would silently do nothing.
			c.errorf(p("tracing"), "tracing.otlp.endpoint is required when tracing is configured")
		}
		return s
	}
	s.Enabled, s.Endpoint, s.Insecure = true, t.OTLP.Endpoint, t.OTLP.Insecure
	if _, _, err := net.SplitHostPort(s.Endpoint); err != nil {
		c.errorf(p("tracing", "otlp", "endpoint"), "must be host:port (%v)", err)
	}
	s.Timeout = c.duration(p("tracing", "otlp", "timeout"), t.OTLP.Timeout, DefaultTracingTimeout, false)
	return s
}

// summary is the check-config line for tracing.
func (s TracingSettings) summary() string {
	if !s.Enabled {
		return "off (no tracing.otlp)"
	}
	tls := "TLS"
	if s.Insecure {
		tls = "plaintext"
	}
	return fmt.Sprintf("OTLP/gRPC %s (%s, timeout %s), sample ratio %v for new traces (a sampled traceparent is always followed), service %s",
		s.Endpoint, tls, s.Timeout, s.SampleRatio, s.ServiceName)
}
