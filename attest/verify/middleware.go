package verify

import (
	"bytes"
	"errors"
	"io"
	"net/http"
)

// Middleware refuses, with 403, every request to next that carries no
// valid attestation for itself (with Options.MCPTools: every guarded
// tools/call). The body is read (up to Options.MaxBodyBytes) and given to
// next unchanged; the claims are in the request's context (ClaimsFrom).
func (v *Verifier) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, v.opts.MaxBodyBytes+1))
		r.Body.Close()
		if err != nil {
			http.Error(w, "failed to read the body", http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		claims, err := v.check(r, body)
		if err != nil {
			v.opts.Logger.Warn("idemgate attestation refused", "reason", err.Error(), "method", r.Method, "path", requestTarget(r), "log_only", v.opts.LogOnly)
			if !v.opts.LogOnly {
				refuse(w, err)
				return
			}
		}
		if claims != nil {
			r = r.WithContext(withClaims(r.Context(), claims))
		}
		next.ServeHTTP(w, r)
	})
}

// check verifies r; (nil, nil) is an MCP message that needs no attestation.
func (v *Verifier) check(r *http.Request, body []byte) (*Claims, error) {
	if int64(len(body)) > v.opts.MaxBodyBytes {
		return nil, errors.New("body too large to check")
	}
	req := Request{Method: r.Method, Path: requestTarget(r), IdempotencyKey: r.Header.Get(v.opts.KeyHeader), Token: r.Header.Get(Header)}
	if len(v.opts.MCPTools) == 0 {
		if req.Token == "" {
			return nil, ErrMissing // before parsing: cheap for floods
		}
		doc, err := parseJSON(body)
		if err != nil {
			return nil, errors.Join(ErrParams, err)
		}
		req.Doc = doc
		return v.Verify(r.Context(), req)
	}
	call, err := v.mcpCall(body)
	if err != nil || call == nil {
		return nil, err
	}
	req.MCPTool, req.Doc = call.tool, call.args
	if call.metaToken != "" {
		if req.Token != "" && req.Token != call.metaToken {
			return nil, errors.Join(ErrRequest, errors.New("header and params._meta attestations differ"))
		}
		req.Token = call.metaToken
	}
	return v.Verify(r.Context(), req)
}

// mcpCall is a guarded tools/call found in a JSON-RPC body.
type mcpCall struct {
	tool      string
	args      any
	metaToken string
}

// mcpCall finds the guarded tools/call in body: nil when the message is
// anything else, an empty body too. A body that is not strict JSON (a
// lenient parser might still read a guarded call in it), or a batch
// holding a guarded call, is refused (idemgate refuses such batches too).
func (v *Verifier) mcpCall(body []byte) (*mcpCall, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, nil // GET (the SSE stream), DELETE (session end): no call
	}
	doc, err := parseJSON(body)
	if err != nil {
		return nil, errors.Join(ErrMalformed, err)
	}
	if batch, ok := doc.([]any); ok {
		for _, m := range batch {
			if v.guardedCall(m) != nil {
				return nil, errors.Join(ErrRequest, errors.New("a batch holds a guarded tools/call"))
			}
		}
		return nil, nil
	}
	return v.guardedCall(doc), nil
}

func (v *Verifier) guardedCall(msg any) *mcpCall {
	m, _ := msg.(object)
	if m == nil || m["method"] != "tools/call" {
		return nil
	}
	params, _ := m["params"].(object)
	name, _ := params["name"].(string)
	if !v.guarded(name) {
		return nil
	}
	call := &mcpCall{tool: name, args: params["arguments"]}
	if call.args == nil {
		call.args = object{}
	}
	if meta, ok := params["_meta"].(object); ok {
		call.metaToken, _ = meta[MCPMetaKey].(string)
	}
	return call
}

// requestTarget is the path and query as received: what idemgate attested
// (Envoy forwards :path unchanged). RequestURI is empty only for requests
// built in-process.
func requestTarget(r *http.Request) string {
	if r.RequestURI != "" {
		return r.RequestURI
	}
	return r.URL.RequestURI()
}

// refuse answers 403 with a JSON body naming the reason class (the detail
// stays in the log).
func refuse(w http.ResponseWriter, err error) {
	reason := "attestation_invalid"
	for _, known := range []struct {
		err  error
		name string
	}{{ErrMissing, "attestation_missing"}, {ErrExpired, "attestation_expired"}, {ErrRequest, "attestation_other_request"}, {ErrParams, "attestation_params_differ"}, {ErrKeysStale, "attestation_keys_stale"}} {
		if errors.Is(err, known.err) {
			reason = known.name
			break
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusForbidden)
	_, _ = io.WriteString(w, `{"error":"`+reason+`","message":"this request did not pass idemgate: refused"}`+"\n")
}
