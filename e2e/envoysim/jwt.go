package envoysim

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"math/big"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
)

// JWTAuthnMetadataNamespace is the dynamic-metadata namespace jwt_authn
// writes payload_in_metadata under.
const JWTAuthnMetadataNamespace = "envoy.filters.http.jwt_authn"

// jwt_verify_lib status strings, which Envoy returns as local-reply bodies.
const (
	jwtMissing             = "Jwt is missing"
	jwtBadFormat           = "Jwt is not in the form of Header.Payload.Signature with two dots and 3 sections"
	jwtHeaderBadBase64     = "Jwt header is an invalid Base64url encoded"
	jwtHeaderBadJSON       = "Jwt header is an invalid JSON"
	jwtHeaderBadAlg        = "Jwt header [alg] field is required and must be a string"
	jwtHeaderNotImplAlg    = "Jwt header [alg] is not supported"
	jwtHeaderBadKid        = "Jwt header [kid] field is not a string"
	jwtPayloadBadBase64    = "Jwt payload is an invalid Base64url encoded"
	jwtPayloadBadJSON      = "Jwt payload is an invalid JSON"
	jwtSignatureBadBase64  = "Jwt signature is an invalid Base64url encoded"
	jwtNotYetValid         = "Jwt not yet valid"
	jwtExpired             = "Jwt is expired"
	jwtUnknownIssuer       = "Jwt issuer is not configured"
	jwtAudienceNotAllowed  = "Audiences in Jwt are not allowed"
	jwtVerificationFails   = "Jwt verification fails"
	jwksKidAlgMismatch     = "Jwks doesn't have key to match kid or alg from Jwt"
	jwtPayloadClaimBadType = "Jwt payload [%s] field is not a %s"
)

type jwk struct {
	kid string
	alg string
	kty string
	pub crypto.PublicKey
}

type jwtProvider struct {
	name string
	cfg  JWTProvider
	keys []jwk
	skew int64
}

type jwtFilterConfig struct {
	providers map[string]*jwtProvider
	rules     []JWTRule
}

func compileJWT(c *JWTAuthn) (*jwtFilterConfig, error) {
	var errs []error
	jc := &jwtFilterConfig{providers: map[string]*jwtProvider{}, rules: slices.Clone(c.Rules)}
	for name, p := range c.Providers {
		keys, err := parseJWKS(p.LocalJWKS)
		if err != nil {
			errs = append(errs, fmt.Errorf("jwt_authn provider %q: %w", name, err))
		}
		skew := int64(60)
		if p.ClockSkewSeconds != nil {
			skew = int64(*p.ClockSkewSeconds)
		}
		jc.providers[name] = &jwtProvider{name: name, cfg: p, keys: keys, skew: skew}
	}
	for i := range jc.rules {
		r := &jc.rules[i]
		if err := r.Match.compile(); err != nil {
			errs = append(errs, fmt.Errorf("jwt_authn rule %d: %w", i, err))
		}
		if r.Requires == nil {
			continue
		}
		req := r.Requires
		kinds := 0
		for _, set := range []bool{req.ProviderName != "", req.AllowMissing, req.AllowMissingOrFailed} {
			if set {
				kinds++
			}
		}
		if kinds != 1 {
			errs = append(errs, fmt.Errorf("jwt_authn rule %d: requirement must be exactly one of provider_name, allow_missing, allow_missing_or_failed", i))
		}
		if req.ProviderName != "" && jc.providers[req.ProviderName] == nil {
			errs = append(errs, fmt.Errorf("jwt_authn rule %d: unknown provider %q", i, req.ProviderName))
		}
	}
	return jc, errors.Join(errs...)
}

// parseJWKS decodes a JWKS document with EC and RSA keys.
func parseJWKS(doc []byte) ([]jwk, error) {
	var set struct {
		Keys []struct {
			Kty string `json:"kty"`
			Kid string `json:"kid"`
			Alg string `json:"alg"`
			Crv string `json:"crv"`
			X   string `json:"x"`
			Y   string `json:"y"`
			N   string `json:"n"`
			E   string `json:"e"`
		} `json:"keys"`
	}
	if err := json.Unmarshal(doc, &set); err != nil {
		return nil, fmt.Errorf("failed to parse the JWKS: %w", err)
	}
	if len(set.Keys) == 0 {
		return nil, errors.New("the JWKS has no keys")
	}
	b64 := base64.RawURLEncoding
	var keys []jwk
	for i, k := range set.Keys {
		switch k.Kty {
		case "EC":
			var curve elliptic.Curve
			switch k.Crv {
			case "P-256":
				curve = elliptic.P256()
			case "P-384":
				curve = elliptic.P384()
			case "P-521":
				curve = elliptic.P521()
			default:
				return nil, fmt.Errorf("JWKS key %d: unsupported curve %q", i, k.Crv)
			}
			x, errX := b64.DecodeString(k.X)
			y, errY := b64.DecodeString(k.Y)
			if errX != nil || errY != nil {
				return nil, fmt.Errorf("JWKS key %d: bad x or y", i)
			}
			pub, err := ecdsa.ParseUncompressedPublicKey(curve, append(append([]byte{4}, padLeft(x, curve)...), padLeft(y, curve)...))
			if err != nil {
				return nil, fmt.Errorf("JWKS key %d: %w", i, err)
			}
			keys = append(keys, jwk{kid: k.Kid, alg: k.Alg, kty: "EC", pub: pub})
		case "RSA":
			n, errN := b64.DecodeString(k.N)
			e, errE := b64.DecodeString(k.E)
			if errN != nil || errE != nil || len(e) == 0 || len(e) > 4 {
				return nil, fmt.Errorf("JWKS key %d: bad n or e", i)
			}
			pub := &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}
			keys = append(keys, jwk{kid: k.Kid, alg: k.Alg, kty: "RSA", pub: pub})
		default:
			return nil, fmt.Errorf("JWKS key %d: kty %q is not modelled (EC and RSA only)", i, k.Kty)
		}
	}
	return keys, nil
}

func padLeft(b []byte, c elliptic.Curve) []byte {
	size := (c.Params().BitSize + 7) / 8
	if len(b) >= size {
		return b
	}
	return append(make([]byte, size-len(b)), b...)
}

// jwtOutcome is a failed verification: the status text and HTTP code.
type jwtOutcome struct {
	msg    string
	status int
}

func (o *jwtOutcome) Error() string { return o.msg }

func fail(msg string) *jwtOutcome { return &jwtOutcome{msg: msg, status: 401} }

// verifiedJWT is a token that passed every check.
type verifiedJWT struct {
	claims map[string]any
}

// verify follows jwt_verify_lib parsing and Envoy's authenticator order:
// format → issuer → time constraints → audiences → key match → signature.
func (p *jwtProvider) verify(token string, audiences []string, now time.Time) (*verifiedJWT, *jwtOutcome) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil, fail(jwtBadFormat)
	}
	b64 := base64.RawURLEncoding
	decode := func(s string) ([]byte, error) { return b64.DecodeString(strings.TrimRight(s, "=")) }
	rawHeader, err := decode(parts[0])
	if err != nil {
		return nil, fail(jwtHeaderBadBase64)
	}
	var header map[string]any
	if json.Unmarshal(rawHeader, &header) != nil || header == nil {
		return nil, fail(jwtHeaderBadJSON)
	}
	alg, ok := header["alg"].(string)
	if !ok {
		return nil, fail(jwtHeaderBadAlg)
	}
	if _, ok := jwtAlgorithms[alg]; !ok {
		return nil, fail(jwtHeaderNotImplAlg)
	}
	kid := ""
	if v, present := header["kid"]; present {
		if kid, ok = v.(string); !ok {
			return nil, fail(jwtHeaderBadKid)
		}
	}
	rawPayload, err := decode(parts[1])
	if err != nil {
		return nil, fail(jwtPayloadBadBase64)
	}
	dec := json.NewDecoder(bytes.NewReader(rawPayload))
	dec.UseNumber()
	var claims map[string]any
	if dec.Decode(&claims) != nil || claims == nil {
		return nil, fail(jwtPayloadBadJSON)
	}
	sig, err := decode(parts[2])
	if err != nil {
		return nil, fail(jwtSignatureBadBase64)
	}

	iss, _ := claims["iss"].(string)
	if _, present := claims["iss"]; present {
		if _, ok := claims["iss"].(string); !ok {
			return nil, fail(fmt.Sprintf(jwtPayloadClaimBadType, "iss", "string"))
		}
	}
	tokenAud, err := audienceClaim(claims["aud"])
	if err != nil {
		return nil, fail(fmt.Sprintf(jwtPayloadClaimBadType, "aud", "string or string list"))
	}
	nbf, errNbf := intClaim(claims, "nbf")
	exp, errExp := intClaim(claims, "exp")
	if errNbf != nil {
		return nil, fail(fmt.Sprintf(jwtPayloadClaimBadType, "nbf", "integer"))
	}
	if errExp != nil {
		return nil, fail(fmt.Sprintf(jwtPayloadClaimBadType, "exp", "integer"))
	}

	if p.cfg.Issuer != "" && iss != p.cfg.Issuer {
		return nil, fail(jwtUnknownIssuer)
	}
	unix := now.Unix()
	if nbf != 0 && unix+p.skew < nbf {
		return nil, fail(jwtNotYetValid)
	}
	if exp != 0 && unix > exp+p.skew {
		return nil, fail(jwtExpired)
	}
	if len(audiences) > 0 && !slices.ContainsFunc(tokenAud, func(a string) bool { return slices.Contains(audiences, a) }) {
		return nil, &jwtOutcome{msg: jwtAudienceNotAllowed, status: 403}
	}

	spec := jwtAlgorithms[alg]
	signed := []byte(parts[0] + "." + parts[1])
	candidates := 0
	for _, k := range p.keys {
		if (kid != "" && k.kid != kid) || (k.alg != "" && k.alg != alg) || k.kty != spec.kty {
			continue
		}
		candidates++
		if spec.verify(k.pub, signed, sig) {
			return &verifiedJWT{claims: claims}, nil
		}
	}
	if candidates == 0 {
		return nil, fail(jwksKidAlgMismatch)
	}
	return nil, fail(jwtVerificationFails)
}

func audienceClaim(v any) ([]string, error) {
	switch a := v.(type) {
	case nil:
		return nil, nil
	case string:
		return []string{a}, nil
	case []any:
		out := make([]string, 0, len(a))
		for _, e := range a {
			s, ok := e.(string)
			if !ok {
				return nil, errors.New("aud entry is not a string")
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, errors.New("aud is neither a string nor a list")
}

func intClaim(claims map[string]any, name string) (int64, error) {
	v, ok := claims[name]
	if !ok {
		return 0, nil
	}
	n, ok := v.(json.Number)
	if !ok {
		return 0, errors.New("not a number")
	}
	return strconv.ParseInt(n.String(), 10, 64)
}

type jwtAlgorithm struct {
	kty    string
	verify func(pub crypto.PublicKey, signed, sig []byte) bool
}

var jwtAlgorithms = map[string]jwtAlgorithm{
	"ES256": ecdsaAlg(sha256.New, 32),
	"ES384": ecdsaAlg(sha512.New384, 48),
	"ES512": ecdsaAlg(sha512.New, 66),
	"RS256": rsaAlg(crypto.SHA256, false),
	"RS384": rsaAlg(crypto.SHA384, false),
	"RS512": rsaAlg(crypto.SHA512, false),
	"PS256": rsaAlg(crypto.SHA256, true),
	"PS384": rsaAlg(crypto.SHA384, true),
	"PS512": rsaAlg(crypto.SHA512, true),
}

func ecdsaAlg(newHash func() hash.Hash, size int) jwtAlgorithm {
	return jwtAlgorithm{kty: "EC", verify: func(pub crypto.PublicKey, signed, sig []byte) bool {
		k, ok := pub.(*ecdsa.PublicKey)
		if !ok || len(sig) != 2*size || (k.Curve.Params().BitSize+7)/8 != size {
			return false
		}
		h := newHash()
		h.Write(signed)
		return ecdsa.Verify(k, h.Sum(nil), new(big.Int).SetBytes(sig[:size]), new(big.Int).SetBytes(sig[size:]))
	}}
}

func rsaAlg(h crypto.Hash, pss bool) jwtAlgorithm {
	return jwtAlgorithm{kty: "RSA", verify: func(pub crypto.PublicKey, signed, sig []byte) bool {
		k, ok := pub.(*rsa.PublicKey)
		if !ok {
			return false
		}
		hh := h.New()
		hh.Write(signed)
		if pss {
			return rsa.VerifyPSS(k, h, hh.Sum(nil), sig, nil) == nil
		}
		return rsa.VerifyPKCS1v15(k, h, hh.Sum(nil), sig) == nil
	}}
}

// extractedToken is a token and where it came from.
type extractedToken struct {
	token  string
	header string // header name, "" for a query parameter
}

// extract finds a token in the provider's locations (Envoy's defaults when
// none are configured: Authorization "Bearer " and access_token).
func (p *jwtProvider) extract(h *headerMap) (extractedToken, bool) {
	headers := p.cfg.FromHeaders
	params := p.cfg.FromParams
	if len(headers) == 0 && len(params) == 0 {
		headers = []JWTHeader{{Name: "authorization", ValuePrefix: "Bearer "}}
		params = []string{"access_token"}
	}
	for _, loc := range headers {
		name := strings.ToLower(loc.Name)
		v, ok := h.get(name)
		if !ok {
			continue
		}
		if loc.ValuePrefix != "" {
			i := strings.Index(v, loc.ValuePrefix)
			if i < 0 {
				continue
			}
			v = v[i+len(loc.ValuePrefix):]
		}
		if tok := leadingJWTChars(v); tok != "" {
			return extractedToken{token: tok, header: name}, true
		}
	}
	if len(params) > 0 {
		path, _ := h.get(":path")
		if _, q, ok := strings.Cut(path, "?"); ok {
			values, _ := url.ParseQuery(q)
			for _, p := range params {
				if tok := values.Get(p); tok != "" {
					return extractedToken{token: tok}, true
				}
			}
		}
	}
	return extractedToken{}, false
}

func leadingJWTChars(v string) string {
	end := 0
	for end < len(v) {
		c := v[end]
		if (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' || c == '=' {
			end++
			continue
		}
		break
	}
	return v[:end]
}

// jwtDecision is what jwt_authn decided for one request.
type jwtDecision struct {
	// denied is non-nil when a local reply must be sent.
	denied *jwtOutcome
}

// decodeHeaders runs the jwt_authn filter on the request headers. On success
// it removes the token header (forward: false), adds claim headers and
// writes payload_in_metadata into dynMeta.
func (j *jwtFilterConfig) decodeHeaders(h *headerMap, dynMeta map[string]*structpb.Struct, now time.Time) jwtDecision {
	path, _ := h.get(":path")
	var req *JWTRequirement
	for i := range j.rules {
		if j.rules[i].Match.matches(path) {
			req = j.rules[i].Requires
			break
		}
	}
	if req == nil {
		return jwtDecision{}
	}
	if req.ProviderName != "" {
		p := j.providers[req.ProviderName]
		tok, ok := p.extract(h)
		if !ok {
			return jwtDecision{denied: fail(jwtMissing)}
		}
		audiences := p.cfg.Audiences
		if len(req.Audiences) > 0 {
			audiences = req.Audiences
		}
		v, out := p.verify(tok.token, audiences, now)
		if out != nil {
			return jwtDecision{denied: out}
		}
		p.apply(h, tok, v, dynMeta)
		return jwtDecision{}
	}
	// allow_missing / allow_missing_or_failed: any provider's token is
	// verified by the provider whose issuer it names.
	names := make([]string, 0, len(j.providers))
	for n := range j.providers {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		p := j.providers[n]
		tok, ok := p.extract(h)
		if !ok {
			continue
		}
		v, out := p.verify(tok.token, p.cfg.Audiences, now)
		if out != nil {
			if req.AllowMissingOrFailed {
				return jwtDecision{}
			}
			return jwtDecision{denied: out}
		}
		p.apply(h, tok, v, dynMeta)
		return jwtDecision{}
	}
	return jwtDecision{}
}

func (p *jwtProvider) apply(h *headerMap, tok extractedToken, v *verifiedJWT, dynMeta map[string]*structpb.Struct) {
	if !p.cfg.Forward && tok.header != "" {
		h.remove(tok.header)
	}
	for _, c := range p.cfg.ClaimToHeaders {
		if s, ok := claimString(v.claims[c.ClaimName]); ok && s != "" {
			h.addCopy(strings.ToLower(c.HeaderName), s)
		}
	}
	if p.cfg.PayloadInMetadata != "" {
		st, err := structpb.NewStruct(jsonNumbersToFloat(v.claims).(map[string]any))
		if err == nil {
			ns := dynMeta[JWTAuthnMetadataNamespace]
			if ns == nil {
				ns = &structpb.Struct{Fields: map[string]*structpb.Value{}}
				dynMeta[JWTAuthnMetadataNamespace] = ns
			}
			ns.Fields[p.cfg.PayloadInMetadata] = structpb.NewStructValue(st)
		}
	}
}

// claimString renders a claim for claim_to_headers: strings as is, numbers
// and booleans printed; objects and lists (base64 JSON in Envoy) are skipped.
func claimString(v any) (string, bool) {
	switch c := v.(type) {
	case string:
		return c, true
	case json.Number:
		return c.String(), true
	case bool:
		return strconv.FormatBool(c), true
	}
	return "", false
}

func jsonNumbersToFloat(v any) any {
	switch c := v.(type) {
	case json.Number:
		f, _ := c.Float64()
		return f
	case map[string]any:
		out := make(map[string]any, len(c))
		for k, e := range c {
			out[k] = jsonNumbersToFloat(e)
		}
		return out
	case []any:
		out := make([]any, len(c))
		for i, e := range c {
			out[i] = jsonNumbersToFloat(e)
		}
		return out
	}
	return v
}

// jwtDeniedDetails is the %RESPONSE_CODE_DETAILS% of a jwt_authn refusal.
func jwtDeniedDetails(msg string) string {
	return "jwt_authn_access_denied{" + strings.ReplaceAll(msg, " ", "_") + "}"
}
