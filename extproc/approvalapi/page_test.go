package approvalapi

import (
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/memory"
	"github.com/idemgate/idemgate/state/statetest"
)

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

func (f *fixture) page(t *testing.T, method, path, token string, form url.Values) (int, string, http.Header) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(t.Context(), method, f.srv.URL+path, body)
	require.NoError(t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := client.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b), res.Header
}

func TestApprovalPage(t *testing.T) {
	store := memory.New(memory.Options{})
	f := newFixture(t, store)
	soon := time.Now().Add(5 * time.Minute)
	alice, bob := f.token(f.key, "alice", soon), f.token(f.key, "bob", soon)
	a, _, err := store.RequestApproval(t.Context(), state.ApprovalRequest{
		ID: state.NewApprovalID(), Key: statetest.NewKey(t), Operation: "transfer", Scope: "payments.transfer", SubjectTag: "tag",
		Requester: "agent-user", ParamHash: "ph", Params: []byte(`{"amount":1500.00,"currency":"EUR","payee.account_id":"<script>x</script>"}`),
		Rules: []string{"amount >= 1000.00"}, Required: 2, DistinctFromRequester: true, ExpiresAt: soon,
	})
	require.NoError(t, err)
	path := "/approvals/" + a.ID

	code, _, _ := f.page(t, "GET", path, "", nil)
	require.Equal(t, 401, code)
	require.Equal(t, []string{ReasonApproverToken}, f.events.take())

	code, html, hdr := f.page(t, "GET", path, alice, nil)
	require.Equal(t, 200, code)
	require.Equal(t, "text/html; charset=utf-8", hdr.Get("Content-Type"))
	require.Contains(t, hdr.Get("Content-Security-Policy"), "default-src 'none'")
	require.Contains(t, html, "<td>amount</td><td>1500.00</td>")
	require.Contains(t, html, "<td>payee.account_id</td><td>&lt;script&gt;x&lt;/script&gt;</td>", "params are escaped")
	require.NotContains(t, html, "<script>")
	require.Contains(t, html, `<span id="requester">agent-user</span>`)
	require.Contains(t, html, "<li>amount &gt;= 1000.00</li>")
	csrf := csrfRE.FindStringSubmatch(html)[1]

	// A post without the page's token (another site's form) is refused.
	code, _, _ = f.page(t, "POST", path, alice, url.Values{"decision": {"approve"}, "reason": {"ok"}})
	require.Equal(t, 403, code)
	require.Equal(t, []string{ReasonForgedForm}, f.events.take())
	code, _, _ = f.page(t, "POST", path, bob, url.Values{"decision": {"approve"}, "reason": {"ok"}, "csrf": {csrf}})
	require.Equal(t, 403, code, "the token is bound to the bearer that loaded the page")
	f.events.take()

	code, html, _ = f.page(t, "POST", path, alice, url.Values{"decision": {"approve"}, "reason": {" "}, "csrf": {csrf}})
	require.Equal(t, 400, code)
	require.Contains(t, html, "A decision needs a reason.")

	code, _, hdr = f.page(t, "POST", path, alice, url.Values{"decision": {"approve"}, "reason": {"payee verified"}, "csrf": {csrf}})
	require.Equal(t, 303, code)
	require.Equal(t, path, hdr.Get("Location"))
	_, html, _ = f.page(t, "GET", path, alice, nil)
	require.Contains(t, html, `<span class="state" id="state">pending</span>`)
	require.Contains(t, html, "<li>alice: approve — payee verified</li>")

	_, html, _ = f.page(t, "GET", path, bob, nil)
	csrf = csrfRE.FindStringSubmatch(html)[1]
	code, _, _ = f.page(t, "POST", path, bob, url.Values{"decision": {"approve"}, "reason": {"within budget"}, "csrf": {csrf}})
	require.Equal(t, 303, code)
	_, html, _ = f.page(t, "GET", path, bob, nil)
	require.Contains(t, html, `<span class="state" id="state">approved</span>`)
	require.NotContains(t, html, "<form", "a decided approval offers no buttons")

	requester := f.token(f.key, "agent-user", soon)
	b, _, err := store.RequestApproval(t.Context(), state.ApprovalRequest{
		ID: state.NewApprovalID(), Key: statetest.NewKey(t), Operation: "transfer", Scope: "payments.transfer", SubjectTag: "tag",
		Requester: "agent-user", ParamHash: "ph", Params: []byte(`{}`), Required: 1, DistinctFromRequester: true, ExpiresAt: soon,
	})
	require.NoError(t, err)
	_, html, _ = f.page(t, "GET", "/approvals/"+b.ID, requester, nil)
	csrf = csrfRE.FindStringSubmatch(html)[1]
	code, html, _ = f.page(t, "POST", "/approvals/"+b.ID, requester, url.Values{"decision": {"approve"}, "reason": {"mine"}, "csrf": {csrf}})
	require.Equal(t, 403, code)
	require.Contains(t, html, "someone else must approve it")
	require.Equal(t, []string{ReasonSelfApproval}, f.events.take())
}
