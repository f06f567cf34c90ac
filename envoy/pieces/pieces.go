// Package pieces writes the Envoy configuration a user pastes into an Envoy
// they already run to put idemgate in front of the operations of one
// idemgate.yaml: the filters, the idemgate cluster, the operation routes and
// a local reply mapping. Everything path-dependent is derived from the
// operations (config.Runtime.GuardedPaths), so the Envoy side and idemgate
// cannot drift apart. `idemgate envoy-config` prints it; the repository's
// envoy/ext_proc-filter.yaml is its output for envoy/idemgate.yaml.
//
// The shape, and why:
//   - ext_proc is delegated to by a composite filter (an ExtensionWithMatcher
//     around envoy.filters.http.composite whose action is ExecuteFilterAction)
//     only for a request whose :path can name a guarded path. The composite
//     creates no ext_proc filter for any other request; a SkipFilter action on
//     ext_proc itself would still create one per request and cost Envoy about
//     7 µs of CPU each (measured: Envoy alone 46, composite 50, skip 54 µs per
//     POST with 2 workers). A request that can
//     (any method, any spelling a lenient upstream router may map to the
//     guarded handler, anything percent-encoded or with dot segments) opens a
//     stream whatever route it takes, and idemgate refuses the spellings and
//     methods it does not check. No route has to disable the filter, so no
//     route table, however written, lets a near miss past it; other traffic
//     opens no stream at all.
//   - The filter-level processing mode is what a guarded request needs (both
//     bodies buffered, both header messages); idemgate switches off per
//     request what it does not need (mode_override). The request body stays
//     BUFFERED at filter level on purpose: were it switched on per request
//     instead, an Envoy that ignored the override would forward a confirm
//     before idemgate saw its body.
package pieces

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/extproc/route"
)

// Options are the deployment facts idemgate.yaml does not hold.
type Options struct {
	// ConfigPath is how the config was named on the command line (printed in
	// the header so a reader knows what to regenerate from).
	ConfigPath string
	// IdemgateAddress is host:port of idemgate's grpc_listen as Envoy
	// reaches it (a sidecar: 127.0.0.1 and the port of grpc_listen), or
	// unix:///path for a unix socket (a pipe address).
	IdemgateAddress string
	// TLS, when set, is how Envoy authenticates to idemgate's grpc_tls
	// listener and idemgate to Envoy: the cluster gets an UpstreamTlsContext.
	TLS *UpstreamTLS
	// UpstreamCluster is the cluster of the operation routes.
	UpstreamCluster string
}

// UpstreamTLS is the client side of idemgate's grpc_tls, as files on
// Envoy's machine.
type UpstreamTLS struct {
	// ClientCert and ClientKey are Envoy's client certificate chain and
	// key (PEM): its SAN must be one of grpc_tls.client_sans.
	ClientCert, ClientKey string
	// CA is the file of the CA certificates that sign idemgate's server
	// certificate.
	CA string
	// SAN is the URI (scheme://...) or DNS SAN idemgate's certificate must
	// carry; SNI is the server name Envoy sends (may be empty).
	SAN, SNI string
}

// SANType is the match_typed_subject_alt_names san_type of a SAN: URI
// when it has a scheme (spiffe://...), DNS otherwise.
func SANType(san string) string {
	if strings.Contains(san, "://") {
		return "URI"
	}
	return "DNS"
}

// unixScheme prefixes an address that is a unix socket path.
const unixScheme = "unix://"

// Render returns the pieces for rt as commented YAML.
func Render(rt *config.Runtime, o Options) ([]byte, error) {
	if o.UpstreamCluster == "" {
		return nil, fmt.Errorf("an upstream cluster name is required")
	}
	data := view{
		ConfigPath:       o.ConfigPath,
		Upstream:         o.UpstreamCluster,
		SubjectHeader:    rt.Subject.Header,
		MetadataNS:       rt.Subject.MetadataNamespace,
		MessageTimeout:   MessageTimeout(rt),
		StoreTimeout:     rt.Store.Timeout,
		MaxBodyBytes:     rt.Limits.MaxBodyBytes,
		Predicates:       Predicates(rt.GuardedPaths()),
		Routes:           operationRoutes(rt),
		GuardedPathRegex: guardedPathRegex(rt.GuardedPaths()),
		ResponseCode:     rt.ReadsResponseCode(),
	}
	if err := data.setAddress(o.IdemgateAddress); err != nil {
		return nil, err
	}
	if t := o.TLS; t != nil {
		if t.ClientCert == "" || t.ClientKey == "" || t.CA == "" || t.SAN == "" {
			return nil, fmt.Errorf("TLS to idemgate needs Envoy's client certificate and key, idemgate's CA and its SAN")
		}
		data.TLS, data.SANType = t, SANType(t.SAN)
	}
	var err error
	if data.TooLarge, err = tooLargeEnvelope(rt); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := piecesTemplate.Execute(&out, data); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// setAddress sets the cluster's address: a pipe for unix:///path, else a
// socket address (STATIC for an IP; a name, such as a Kubernetes Service,
// is resolved by Envoy and re-resolved when it changes: STRICT_DNS).
func (v *view) setAddress(addr string) error {
	if path, ok := strings.CutPrefix(addr, unixScheme); ok {
		if !strings.HasPrefix(path, "/") || len(path) > 107 {
			return fmt.Errorf("idemgate address %q: a unix socket needs an absolute path of at most 107 bytes", addr)
		}
		v.ClusterType, v.Pipe = "STATIC", path
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("idemgate address %q: %w", addr, err)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("idemgate address %q: bad port", addr)
	}
	v.ClusterType, v.Host, v.Port = "STATIC", host, port
	if net.ParseIP(host) == nil {
		v.ClusterType = "STRICT_DNS"
	}
	return nil
}

// MessageTimeout is ext_proc's message_timeout for rt: at least four store
// calls (a confirm may make a call, time out, and answer from a fallback)
// and never under Envoy-side noise, rounded up to whole seconds.
func MessageTimeout(rt *config.Runtime) time.Duration {
	d := 4 * rt.Store.Timeout
	if d < time.Second {
		d = time.Second
	}
	return d.Round(time.Second)
}

// Predicate is one way a :path can name a guarded path, as an Envoy
// StringMatcher: a case-insensitive prefix for a literal path (it covers the
// path itself, a trailing "/", ";x", ".json" and any case), a regex for a
// templated one, and one regex for every path a cleaning or decoding router
// may read differently from its bytes (percent-encoding, "\", "//", dot
// segments, ";", non-ASCII).
type Predicate struct {
	Prefix string
	Regex  string
}

// Envoy's StringMatcher regexes must match the whole string.

// SuspiciousPathRegex matches a :path whose path part holds anything a
// router may decode or clean: such a request goes to idemgate, which reads
// it as the most lenient router would (route.Loose).
const SuspiciousPathRegex = `[^?#]*(?:%|\\|//|/\.|;|[^\x00-\x7f]).*`

// Predicates are the StringMatchers on :path under which ext_proc runs.
func Predicates(paths []route.GuardedPath) []Predicate {
	out := []Predicate{{Regex: SuspiciousPathRegex}}
	seen := map[string]bool{}
	for _, gp := range paths {
		p := Predicate{}
		if !strings.Contains(gp.Path, "{") {
			p.Prefix = gp.Path
		} else {
			p.Regex = "(?i)" + templateRegex(gp.Path) + ".*"
		}
		if key := p.Prefix + "\x00" + p.Regex; !seen[key] {
			seen[key] = true
			out = append(out, p)
		}
	}
	return out
}

// templateRegex is a path template as RE2: literals quoted, a {name}
// segment as one non-empty segment.
func templateRegex(path string) string {
	segs := strings.Split(strings.TrimPrefix(path, "/"), "/")
	var b strings.Builder
	for _, s := range segs {
		b.WriteByte('/')
		if strings.HasPrefix(s, "{") {
			b.WriteString(`[^/?#]+`)
			continue
		}
		b.WriteString(regexp.QuoteMeta(s))
	}
	return b.String()
}

// guardedPathRegex matches the guarded paths as idemgate reads them (any
// case, an optional trailing "/", a query string): the local reply mapping
// answers only their 413s with an envelope.
func guardedPathRegex(paths []route.GuardedPath) string {
	var alts []string
	seen := map[string]bool{}
	for _, gp := range paths {
		r := templateRegex(gp.Path)
		if !seen[r] {
			seen[r] = true
			alts = append(alts, r)
		}
	}
	return `(?i)^(?:` + strings.Join(alts, "|") + `)/?(?:\?.*)?$`
}

type opRoute struct {
	Op, Name, Path, Regex string
	Timeout               time.Duration
	Confirm, Status       bool
	RetryOn               string
	Retries               int
}

// MCPRetryOn is the retry condition of an MCP endpoint's route: only a
// request that never reached the upstream is retried.
const MCPRetryOn = "connect-failure,reset-before-request"

// operationRoutes are the routes of every operation: each HTTP path, a
// confirm with the operation's timeout and only the retries that keep its
// key (reset only when the downstream honours keys), and each MCP endpoint
// with its operation's retries, only before the request reached the
// upstream.
func operationRoutes(rt *config.Runtime) []opRoute {
	var out []opRoute
	seenMCP := map[string]bool{}
	for _, op := range rt.Operations {
		for _, r := range []struct {
			kind config.Kind
			r    config.Route
		}{{config.KindPreview, op.Preview}, {config.KindConfirm, op.Confirm}, {config.KindStatus, op.Status}} {
			if r.r.Method == "" {
				continue
			}
			or := opRoute{Op: op.Name, Name: op.Name + "_" + r.kind.String(), Path: r.r.Template.String()}
			if strings.Contains(or.Path, "{") {
				or.Regex, or.Path = templateRegex(or.Path), ""
			}
			switch r.kind {
			case config.KindConfirm:
				or.Confirm = true
				or.Timeout = op.UpstreamTimeout
				or.Retries = op.UpstreamRetries
				or.RetryOn = "connect-failure,reset-before-request"
				if op.HonoursKeys() {
					or.RetryOn = "reset,connect-failure"
				}
			case config.KindStatus:
				or.Status = true
				or.Timeout = 5 * time.Second
			default:
				or.Timeout = op.UpstreamTimeout
			}
			out = append(out, or)
		}
		if op.MCP != nil && op.MCP.Endpoint != "" && !seenMCP[op.MCP.Endpoint] {
			seenMCP[op.MCP.Endpoint] = true
			// One route carries the guarded confirm tool and every other
			// tools/call, which has no idempotency key: retry only what never
			// reached the upstream, whatever the downstream does with keys.
			out = append(out, opRoute{Op: op.Name, Name: op.Name, Path: op.MCP.Endpoint, Timeout: op.UpstreamTimeout, Confirm: true,
				RetryOn: MCPRetryOn, Retries: op.UpstreamRetries})
		}
	}
	return out
}

// envelopeFields are the fields of an envelope a local reply writes.
type envelopeFields struct {
	Status      string `json:"status"`
	Meaning     string `json:"meaning"`
	Instruction string `json:"instruction"`
}

// tooLargeEnvelope is the request_too_large envelope in rt's language, for
// a local reply's json_format (Envoy adds the request id).
func tooLargeEnvelope(rt *config.Runtime) (envelopeFields, error) {
	var f envelopeFields
	set, err := envelope.Compile(rt.Language, nil, envelope.Operation{MaxBodyBytes: rt.Limits.MaxBodyBytes})
	if err != nil {
		return f, err
	}
	r := set.Render(envelope.RequestTooLarge, "", 0, envelope.Extra{})
	err = json.Unmarshal(r.Body, &f)
	return f, err
}

type view struct {
	ConfigPath       string
	ClusterType      string
	Host, Port       string
	Pipe             string
	TLS              *UpstreamTLS
	SANType          string
	Upstream         string
	SubjectHeader    string
	MetadataNS       string
	MessageTimeout   time.Duration
	StoreTimeout     time.Duration
	MaxBodyBytes     int64
	Predicates       []Predicate
	Routes           []opRoute
	TooLarge         envelopeFields
	GuardedPathRegex string
	// ResponseCode asks Envoy for the response.code attribute (a preview
	// with fingerprint_header: false reads its status from it).
	ResponseCode bool
}

// yamlString quotes s for YAML (a JSON string is a YAML flow scalar).
func yamlString(s string) string { return strconv.Quote(s) }

var piecesTemplate = template.Must(template.New("pieces").Funcs(template.FuncMap{
	"q":       yamlString,
	"seconds": func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s" },
	"millis":  func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) + "ms" },
}).Parse(piecesText))
