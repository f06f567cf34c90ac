package extproc

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/extproc/mcp"
	"github.com/idemgate/idemgate/extproc/requeststate"
	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/memory"
)

const publicURL = "https://approvals.example.com"

// withApprovalPage is withApproval with approval.public_url set.
func withApprovalPage(yaml string) string {
	return strings.Replace(withApproval(yaml), "      ttl: 24h\n", "      ttl: 24h\n      public_url: "+publicURL+"/\n", 1)
}

// urlClient is the _meta of a 2026-07-28 client that declares URL-mode
// elicitation (as the official Python SDK sends it).
const urlClient = `{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{"form":{},"url":{}}}}`

// confirmCall is a tools/call of the confirm tool with _meta and more
// params members (raw, e.g. `,"requestState":"..."`).
func confirmCall(id, amount, fp, meta, more string) []byte {
	return rpc(id, "tools/call", `{"name":"transfer_confirm","arguments":`+transferArgs(amount, fp)+`,"_meta":`+meta+more+`}`)
}

func retryWith(state, action string) string {
	return `,"inputResponses":{"io.idemgate/approval":{"action":"` + action + `"}},"requestState":"` + state + `"`
}

// recorder keeps what the upstream received.
type recorder struct {
	mu     sync.Mutex
	up     *mcpServer
	bodies [][]byte
}

func (r *recorder) handle(h map[string]string, b []byte) upstreamReply {
	r.mu.Lock()
	r.bodies = append(r.bodies, append([]byte(nil), b...))
	r.mu.Unlock()
	return r.up.handle(h, b)
}

type inputFixture struct {
	e     *env
	d     fakeDialer
	m     *memory.Store
	rec   *recorder
	clock *clock
}

func newInputFixture(t *testing.T, yaml string) *inputFixture {
	clk := newClock()
	m := memory.New(memory.Options{Now: clk.Now})
	e := newApprovalEnvYAML(t, yaml, m, m, clk)
	return &inputFixture{e: e, d: fakeDialer{srv: e.srv}, m: m, rec: &recorder{up: newMCPServer(false)}, clock: clk}
}

func (f *inputFixture) preview(t *testing.T, subject, amount string) string {
	t.Helper()
	res := do(t, f.d, mcpPost(subject, rpc(`1`, "tools/call", callParams("transfer_preview", transferArgs(amount, ""))), modern("tools/call", "transfer_preview")...), f.rec.up.handle)
	sc := finalMessage(t, res.body)["result"].(map[string]any)["structuredContent"].(map[string]any)
	return sc["fingerprint"].(string)
}

func (f *inputFixture) confirm(t *testing.T, subject string, body []byte) result {
	t.Helper()
	return do(t, f.d, mcpPost(subject, body, modern("tools/call", "transfer_confirm")...), f.rec.handle)
}

// inputRequired checks an input_required answer and returns the approval
// id (from the URL), the message and the requestState.
func inputRequired(t *testing.T, res result, id string) (approvalID, message, reqState string) {
	t.Helper()
	require.NotNil(t, res.immediate, string(res.body))
	require.Equal(t, 200, res.status)
	require.True(t, strings.HasPrefix(string(res.body), `{"jsonrpc":"2.0","id":`+id+`,"result":`), string(res.body))
	r := finalMessage(t, res.body)["result"].(map[string]any)
	require.Equal(t, "input_required", r["resultType"], string(res.body))
	reqs := r["inputRequests"].(map[string]any)
	require.Len(t, reqs, 1)
	er := reqs[mcp.ApprovalInputKey].(map[string]any)
	require.Equal(t, "elicitation/create", er["method"])
	p := er["params"].(map[string]any)
	require.Equal(t, "url", p["mode"])
	url := p["url"].(string)
	approvalID, ok := strings.CutPrefix(url, publicURL+"/approvals/")
	require.True(t, ok, url)
	return approvalID, p["message"].(string), r["requestState"].(string)
}

func (f *inputFixture) executions() int { return f.rec.up.Executions() }

// TestMCPInputRequest (docs/design.md §13): a 2026-07-28 client declaring
// URL elicitation gets the approval page as an input request; its retry
// with idemgate's state answers by the approval (pending: the §10 tool
// result, never another round; granted: executed once, without idemgate's
// input response and state; then replayed).
func TestMCPInputRequest(t *testing.T) {
	f := newInputFixture(t, withApprovalPage(mcpConfigYAML))
	const alice = "user-alice"
	fp := f.preview(t, alice, `"1500.00"`)

	res := f.confirm(t, alice, confirmCall(`2`, `"1500.00"`, fp, urlClient, ""))
	id, message, st := inputRequired(t, res, `2`)
	require.Equal(t, "Approve transfer: amount 1500, currency EUR, payee.account_id DE89. Open the page and decide there, then come back here: the call continues by itself.", message)
	require.Zero(t, f.executions())
	a, found, err := f.m.GetApproval(t.Context(), id)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, state.ApprovalPending, a.State)

	// The same first call again: the same approval, asked again.
	again, _, st2 := inputRequired(t, f.confirm(t, alice, confirmCall(`3`, `"1500.00"`, fp, urlClient, "")), `3`)
	require.Equal(t, id, again)
	require.NotEmpty(t, st2)

	// The person has not decided (or declined on the client): the retry
	// is a tool result with the URL, not another round.
	for _, action := range []string{"accept", "decline", "cancel"} {
		r := toolResult(t, f.confirm(t, alice, confirmCall(`4`, `"1500.00"`, fp, urlClient, retryWith(st, action))), `4`, "approval_pending", true)
		sc := r["structuredContent"].(map[string]any)
		require.Equal(t, id, sc["approval_id"])
		require.Equal(t, publicURL+"/approvals/"+id, sc["approval_url"])
		require.Equal(t, "complete", r["resultType"])
	}
	require.Zero(t, f.executions())

	out, _, err := f.m.DecideApproval(t.Context(), state.Decision{ID: id, Approver: "user-bob", Approve: true, Reason: "ok"})
	require.NoError(t, err)
	require.Equal(t, state.DecisionRecorded, out)

	res = f.confirm(t, alice, confirmCall(`5`, `"1500.00"`, fp, urlClient, retryWith(st, "accept")))
	require.Nil(t, res.immediate, string(res.body))
	require.Equal(t, 1, f.executions())
	// What the upstream received: no trace of idemgate's round.
	var sent struct {
		Params map[string]json.RawMessage `json:"params"`
	}
	require.NoError(t, json.Unmarshal(res.upstreamBody, &sent), string(res.upstreamBody))
	require.NotContains(t, sent.Params, "inputResponses")
	require.NotContains(t, sent.Params, "requestState")
	require.NotContains(t, string(res.upstreamBody), st)
	require.NotContains(t, string(res.upstreamBody), mcp.ApprovalInputKey)
	require.Contains(t, string(sent.Params["_meta"]), "clientCapabilities", "the client's own _meta passes")
	a, _, err = f.m.GetApproval(t.Context(), id)
	require.NoError(t, err)
	require.Equal(t, state.ApprovalConsumed, a.State)

	// The SDK's retry again (a lost answer), and a fresh call: replays.
	toolResult(t, f.confirm(t, alice, confirmCall(`6`, `"1500.00"`, fp, urlClient, retryWith(st, "accept"))), `6`, "already_completed", false)
	toolResult(t, f.confirm(t, alice, confirmCall(`7`, `"1500.00"`, fp, urlClient, "")), `7`, "already_completed", false)
	require.Equal(t, 1, f.executions())
	for _, b := range f.rec.bodies {
		require.NotContains(t, string(b), "requestState")
	}

	// Denied while the client showed the page: the retry is §10's refusal.
	fp = f.preview(t, alice, `"2500.00"`)
	id, _, st = inputRequired(t, f.confirm(t, alice, confirmCall(`8`, `"2500.00"`, fp, urlClient, "")), `8`)
	_, _, err = f.m.DecideApproval(t.Context(), state.Decision{ID: id, Approver: "user-bob", Approve: false, Reason: "unknown payee"})
	require.NoError(t, err)
	r := toolResult(t, f.confirm(t, alice, confirmCall(`9`, `"2500.00"`, fp, urlClient, retryWith(st, "accept"))), `9`, "approval_denied", true)
	require.Equal(t, id, r["structuredContent"].(map[string]any)["approval_id"])
	require.Equal(t, 1, f.executions())
}

// TestMCPInputRequestOnlyForURLClients: clients that cannot show a URL,
// and those before 2026-07-28, get the §10 tool result with approval_url;
// without public_url nobody gets an input request.
func TestMCPInputRequestOnlyForURLClients(t *testing.T) {
	f := newInputFixture(t, withApprovalPage(mcpConfigYAML))
	const alice = "user-alice"
	for i, meta := range []string{
		`{}`,
		`{"io.modelcontextprotocol/clientCapabilities":{"elicitation":{"form":{}}}}`,
		`{"io.modelcontextprotocol/clientCapabilities":{}}`,
	} {
		fp := f.preview(t, alice, `"1500.00"`)
		r := toolResult(t, f.confirm(t, alice, confirmCall(`2`, `"1500.00"`, fp, meta, "")), `2`, "approval_pending", true)
		sc := r["structuredContent"].(map[string]any)
		require.Equal(t, publicURL+"/approvals/"+sc["approval_id"].(string), sc["approval_url"], i)
		// The status tool says the same.
		st := toolResult(t, do(t, f.d, mcpPost(alice, rpc(`3`, "tools/call", callParams("transfer_status", `{"fingerprint":"`+fp+`"}`)), modern("tools/call", "transfer_status")...), neverCalled(t)), `3`, "approval_pending", false)
		require.Equal(t, sc["approval_url"], st["structuredContent"].(map[string]any)["approval_url"])
	}
	// A 2025-11-25 client (no mirrored headers) declaring URL elicitation.
	fp := f.preview(t, alice, `"1500.00"`)
	res := do(t, f.d, mcpPost(alice, confirmCall(`2`, `"1500.00"`, fp, urlClient, ""), header{"mcp-protocol-version", "2025-11-25"}), neverCalled(t))
	toolResult(t, res, `2`, "approval_pending", true)

	g := newInputFixture(t, withApproval(mcpConfigYAML))
	fp = g.preview(t, alice, `"1500.00"`)
	r := toolResult(t, g.confirm(t, alice, confirmCall(`2`, `"1500.00"`, fp, urlClient, "")), `2`, "approval_pending", true)
	require.NotContains(t, r["structuredContent"], "approval_url")
	require.Zero(t, f.executions()+g.executions())
}

// TestMCPRequestStateRefused: every requestState idemgate did not seal for
// this very call is a JSON-RPC error with a security event, and nothing
// runs, even once the approval is granted.
func TestMCPRequestStateRefused(t *testing.T) {
	f := newInputFixture(t, withApprovalPage(mcpConfigYAML))
	const alice = "user-alice"
	fp := f.preview(t, alice, `"1500.00"`)
	id, _, st := inputRequired(t, f.confirm(t, alice, confirmCall(`2`, `"1500.00"`, fp, urlClient, "")), `2`)
	// Another fingerprint of alice's, with its own approval and state.
	fp2 := f.preview(t, alice, `"2500.00"`)
	id2, _, st2 := inputRequired(t, f.confirm(t, alice, confirmCall(`2`, `"2500.00"`, fp2, urlClient, "")), `2`)
	for _, a := range []string{id, id2} {
		_, _, err := f.m.DecideApproval(t.Context(), state.Decision{ID: a, Approver: "user-bob", Approve: true, Reason: "ok"})
		require.NoError(t, err)
	}
	seal := func(s requeststate.State) string {
		out, err := f.e.srv.states.Seal(s)
		require.NoError(t, err)
		return out
	}
	a, _, err := f.m.GetApproval(t.Context(), id)
	require.NoError(t, err)
	flipped := []byte(st)
	flipped[len(flipped)/2] ^= 1
	events := func() float64 {
		return metricValue(t, f.e.metrics.securityEvents.WithLabelValues(security.ReasonRequestState))
	}
	cases := map[string]string{
		"tampered":          retryWith(string(flipped), "accept"),
		"foreign":           retryWith("eyJzdGVwIjoyfQ", "accept"),
		"another nonce's":   retryWith(st2, "accept"),
		"another nonce":     retryWith(seal(requeststate.State{Nonce: strings.Repeat("0", len(a.Key)), ApprovalID: id, SubjectTag: a.SubjectTag, Expires: a.ExpiresAt}), "accept"),
		"another subject's": retryWith(seal(requeststate.State{Nonce: a.Key, ApprovalID: id, SubjectTag: "someone-else", Expires: a.ExpiresAt}), "accept"),
		"another approval":  retryWith(seal(requeststate.State{Nonce: a.Key, ApprovalID: id2, SubjectTag: a.SubjectTag, Expires: a.ExpiresAt}), "accept"),
		"expired":           retryWith(seal(requeststate.State{Nonce: a.Key, ApprovalID: id, SubjectTag: a.SubjectTag, Expires: f.clock.Now().Add(time.Second)}), "accept"),
		"state without response is fine but a response without state is not": `,"inputResponses":{"io.idemgate/approval":{"action":"accept"}}`,
		"someone else's response beside idemgate's state":                    `,"inputResponses":{"io.idemgate/approval":{"action":"accept"},"other":{"action":"accept"}},"requestState":"` + st + `"`,
		"state not a string": `,"requestState":{"s":"` + st + `"}`,
	}
	f.clock.Advance(2 * time.Second)
	for name, more := range cases {
		before := events()
		res := f.confirm(t, alice, confirmCall(`9`, `"1500.00"`, fp, urlClient, more))
		m := protocolError(t, res, 400, mcp.InvalidParams)
		require.Equal(t, float64(9), m["id"], name)
		require.False(t, res.upstreamCalled, name)
		if name != "state not a string" {
			require.Equal(t, before+1, events(), name)
		}
	}
	require.Zero(t, f.executions())
	a, _, err = f.m.GetApproval(t.Context(), id)
	require.NoError(t, err)
	require.Equal(t, state.ApprovalApproved, a.State, "nothing consumed")

	// Its own state still works.
	res := f.confirm(t, alice, confirmCall(`10`, `"1500.00"`, fp, urlClient, retryWith(st, "accept")))
	require.Nil(t, res.immediate, string(res.body))
	require.Equal(t, 1, f.executions())
}

// TestMCPMethodHeaderMismatch (mutation audit): a body that is not a
// tools/call under headers saying tools/call of the confirm tool is
// refused by the Mcp-Method check itself (the Mcp-Name check never looks
// at a body that is not a tools/call).
func TestMCPMethodHeaderMismatch(t *testing.T) {
	f := newInputFixture(t, withApprovalPage(mcpConfigYAML))
	res := do(t, f.d, mcpPost("user-alice", rpc(`1`, "ping", `{}`), modern("tools/call", "transfer_confirm")...), neverCalled(t))
	m := protocolError(t, res, 400, mcp.HeaderMismatch)
	require.Contains(t, m["error"].(map[string]any)["message"], "Mcp-Method")
}

// TestApprovalStoresDistinctFromRequester (mutation audit): the approval a
// gated confirm creates carries the operation's distinct_from_requester
// and required, so the store enforces what the config says.
func TestApprovalStoresDistinctFromRequester(t *testing.T) {
	for _, c := range []struct {
		extra    string
		distinct bool
		required int
	}{
		{"", true, 1},
		{"        distinct_from_requester: false\n        required: 2\n", false, 2},
	} {
		yaml := strings.Replace(withApprovalPage(mcpConfigYAML), "jwks_file: /approvers.jwks}\n", "jwks_file: /approvers.jwks}\n"+c.extra, 1)
		f := newInputFixture(t, yaml)
		fp := f.preview(t, "user-alice", `"1500.00"`)
		r := toolResult(t, f.confirm(t, "user-alice", confirmCall(`2`, `"1500.00"`, fp, `{}`, "")), `2`, "approval_pending", true)
		a, found, err := f.m.GetApproval(t.Context(), r["structuredContent"].(map[string]any)["approval_id"].(string))
		require.NoError(t, err)
		require.True(t, found)
		require.Equal(t, c.distinct, a.DistinctFromRequester)
		require.Equal(t, c.required, a.Required)
		require.Equal(t, "user-alice", a.Requester)
		out, _, err := f.m.DecideApproval(t.Context(), state.Decision{ID: a.ID, Approver: "user-alice", Approve: true, Reason: "mine"})
		require.NoError(t, err)
		if c.distinct {
			require.Equal(t, state.DecisionSelfApproval, out)
		} else {
			require.Equal(t, state.DecisionRecorded, out)
		}
	}
}

// TestHTTPApprovalURL (docs/design.md §13): with approval.public_url the
// HTTP 202 approval_pending and the status route carry approval_url.
func TestHTTPApprovalURL(t *testing.T) {
	clk := newClock()
	m := memory.New(memory.Options{Now: clk.Now})
	e := newApprovalEnvYAML(t, withApprovalPage(testConfigYAML), m, m, clk)
	d := fakeDialer{srv: e.srv}
	res := do(t, d, post("/v1/transfers/preview", "user-alice", transferBody("1500.00", "EUR", "DE89", "")), previewOK)
	fp := res.json(t)["fingerprint"].(string)
	res = do(t, d, post("/v1/transfers/confirm", "user-alice", transferBody("1500.00", "EUR", "DE89", fp)), neverCalled(t))
	body := requireEnvelope(t, res, 202, "approval_pending", true)
	id := body["approval_id"].(string)
	require.Equal(t, publicURL+"/approvals/"+id, body["approval_url"])
	res = do(t, d, post("/v1/transfers/status", "user-alice", []byte(`{"fingerprint":"`+fp+`"}`)), neverCalled(t))
	require.Equal(t, publicURL+"/approvals/"+id, res.json(t)["approval_url"])
}

// TestApprovalMessage: the elicitation's message names the operation and
// the bound params exactly, in the configured language.
func TestApprovalMessage(t *testing.T) {
	params := []byte(`{"amount":"1500","currency":"EUR","payee.account_id":"DE89","n":7}`)
	require.Equal(t, "Approve transfer: amount 1500, currency EUR, payee.account_id DE89, n 7. Open the page and decide there, then come back here: the call continues by itself.",
		approvalMessage("en", "transfer", params))
	require.Equal(t, "请批准 transfer：amount 1500，currency EUR，payee.account_id DE89，n 7。请打开页面做出决定，然后回到这里：调用会自动继续。",
		approvalMessage("zh", "transfer", params))
}
