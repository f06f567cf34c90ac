package approvalapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/idemgate/idemgate/extproc/approver"
	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/state"
)

// The approval page: GET /approvals/{id} shows one approval — exactly the
// canonical params that will run, the operation, the requester, the rules
// that fired and the decisions so far — with approve/deny and a reason;
// POST /approvals/{id} (a form) decides and redirects back. Like the JSON
// API it trusts only the bearer token the SSO proxy sets: the approver is
// the token's sub, and nothing the agent wrote is rendered but the bound
// params (escaped). A form carries a token derived from the bearer token
// and the approval id, so another site cannot make an approver's browser
// post a decision through the proxy (cross-site request forgery). No
// script runs on the page.

var pageTemplate = template.Must(template.New("approval").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Approval {{.View.ApprovalID}}</title>
<style>body{font-family:sans-serif;max-width:48rem;margin:2rem auto;padding:0 1rem}
table{border-collapse:collapse}td,th{border:1px solid #999;padding:.3rem .6rem;text-align:left}
.state{font-weight:bold}.error{color:#a00}</style></head>
<body>
<h1>Approve {{.View.Operation}}?</h1>
{{if .Error}}<p class="error" id="error">{{.Error}}</p>{{end}}
<p>State: <span class="state" id="state">{{.View.State}}</span> · requested by <span id="requester">{{.View.Requester}}</span>
 at <span id="created">{{.Created}}</span> · lapses at <span id="expires">{{.Expires}}</span> · needs {{.View.Required}} approver(s)</p>
<h2>What will run</h2>
<table id="params"><tr><th>parameter</th><th>value</th></tr>
{{range .Params}}<tr><td>{{.Path}}</td><td>{{.Value}}</td></tr>{{end}}</table>
<h2>Why it needs approval</h2>
<ul id="rules">{{range .View.Rules}}<li>{{.}}</li>{{end}}</ul>
<h2>Decisions</h2>
<ul id="decisions">{{range .View.Decisions}}<li>{{.Approver}}: {{.Decision}} — {{.Reason}}{{if .ACR}} (authenticated {{.ACR}}){{end}}</li>{{else}}<li>none yet</li>{{end}}</ul>
{{if .Decided}}<p id="return"><b>Your decision is recorded. Return to your agent:</b> {{if eq .View.State "approved"}}it runs the operation when it calls again (an agent that opened this page from its client continues by itself).{{else}}nothing will run.{{end}}</p>{{end}}
{{if and .Pending .CSRF}}<form method="post" action="/approvals/{{.View.ApprovalID}}">
<input type="hidden" name="csrf" value="{{.CSRF}}">
<p>You are <b id="approver">{{.Approver}}</b>.</p>
<p><label>Reason <textarea name="reason" id="reason" required rows="3" cols="60"></textarea></label></p>
<p><button type="submit" name="decision" value="approve" id="approve">Approve</button>
<button type="submit" name="decision" value="deny" id="deny">Deny</button></p>
</form>{{end}}
</body></html>
`))

type pageParam struct{ Path, Value string }

type pageData struct {
	View             View
	Params           []pageParam
	Created, Expires string
	Pending, Decided bool
	Approver, CSRF   string
	Error            string
}

// csrfToken binds a form to the bearer token that loaded it and to one
// approval.
func csrfToken(bearer, id string) string {
	sum := sha256.Sum256([]byte("idemgate-approval-form\x00" + bearer + "\x00" + id))
	return hex.EncodeToString(sum[:16])
}

func bearerOf(r *http.Request) string {
	_, tok, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	return strings.TrimSpace(tok)
}

// page serves /approvals/{id}.
func (h *Handler) page(w http.ResponseWriter, r *http.Request, id string, who approver.Claims, ops map[string]bool) {
	switch r.Method {
	case http.MethodGet:
		a, ok := h.get(w, r, id, ops)
		if !ok {
			return
		}
		if need := h.stepUpFor(&a, who); need != nil && a.State == state.ApprovalPending {
			// The requester may decide here only once stepped up: the
			// SSO proxy (or the agent's client) authenticates them again.
			h.askStepUp(w, r, &a, need)
			h.renderPage(w, http.StatusUnauthorized, &a, who.Subject, "", "You requested this operation. To approve it yourself, sign in again with a stronger or more recent authentication ("+need.describe()+").")
			return
		}
		h.renderPage(w, http.StatusOK, &a, who.Subject, csrfToken(bearerOf(r), id), "")
	case http.MethodPost:
		h.pageDecide(w, r, id, who, ops)
	default:
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use GET or POST")
	}
}

func (h *Handler) pageDecide(w http.ResponseWriter, r *http.Request, id string, who approver.Claims, ops map[string]bool) {
	subject := who.Subject
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := r.ParseForm(); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_body", "a form with decision, reason and csrf is expected")
		return
	}
	want := csrfToken(bearerOf(r), id)
	if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(want)) != 1 || r.Header.Get("Sec-Fetch-Site") == "cross-site" {
		h.report(r, security.Event{Reason: ReasonForgedForm, Operation: "", Request: "POST /approvals/" + quoteCut(id)})
		writeError(w, http.StatusForbidden, "forged_form", "this form was not loaded from the approval page by you; reload the page")
		return
	}
	approve := false
	switch r.PostForm.Get("decision") {
	case "approve":
		approve = true
	case "deny":
	default:
		writeError(w, http.StatusBadRequest, "invalid_decision", "decision must be approve or deny")
		return
	}
	reason := r.PostForm.Get("reason")
	a, ok := h.get(w, r, id, ops)
	if !ok {
		return
	}
	if strings.TrimSpace(reason) == "" {
		h.renderPage(w, http.StatusBadRequest, &a, subject, want, "A decision needs a reason.")
		return
	}
	d, need := h.decision(&a, who, approve, reason)
	if need != nil {
		h.askStepUp(w, r, &a, need)
		h.renderPage(w, http.StatusUnauthorized, &a, subject, "", "You requested this operation. To approve it yourself, sign in again with a stronger or more recent authentication ("+need.describe()+"). Nothing was decided.")
		return
	}
	out, after, err := h.makeDecision(r, d, "page")
	if err != nil {
		h.storeFailed(w, "decide approval", err)
		return
	}
	switch out {
	case state.DecisionRecorded, state.DecisionRepeated:
		http.Redirect(w, r, "/approvals/"+url.PathEscape(id), http.StatusSeeOther)
	case state.DecisionSelfApproval:
		h.renderPage(w, http.StatusForbidden, &after, subject, want, "You requested this operation: someone else must approve it. You may deny it.")
	case state.DecisionNotPending:
		h.renderPage(w, http.StatusConflict, &after, subject, want, "This approval is "+strings.ToLower(string(after.State))+": nothing was decided.")
	case state.DecisionNotFound:
		writeError(w, http.StatusNotFound, "not_found", "no such approval")
	}
}

func (h *Handler) renderPage(w http.ResponseWriter, status int, a *state.Approval, approver, csrf, msg string) {
	v := ViewOf(a)
	d := pageData{
		View: v, Params: flatten("", v.Params), Pending: a.State == state.ApprovalPending,
		Decided: a.State == state.ApprovalApproved || a.State == state.ApprovalDenied,
		Created: v.CreatedAt.Format(time.RFC3339), Expires: v.ExpiresAt.Format(time.RFC3339),
		Approver: approver, CSRF: csrf, Error: msg,
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "no-referrer")
	w.WriteHeader(status)
	if err := pageTemplate.Execute(w, d); err != nil {
		h.opts.Logger.Warn("failed to render the approval page", "approval_id", a.ID, "error", err)
	}
}

// flatten lists nested params as dotted paths, sorted.
func flatten(prefix string, m map[string]any) []pageParam {
	var out []pageParam
	for k, v := range m {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		if sub, ok := v.(map[string]any); ok {
			out = append(out, flatten(p, sub)...)
			continue
		}
		out = append(out, pageParam{Path: p, Value: fmt.Sprint(v)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}
