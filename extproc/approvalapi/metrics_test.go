package approvalapi

import (
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/extproc"
	"github.com/idemgate/idemgate/state/memory"
)

// transitions reads idemgate_approval_transitions_total{operation=transfer}
// by transition from reg.
func transitions(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "idemgate_approval_transitions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			require.Equal(t, "transfer", labels["operation"])
			out[labels["transition"]] = m.GetCounter().GetValue()
		}
	}
	return out
}

// TestDecisionsCountTransitions: a decision on the approvers' API that
// moves an approval counts once in serve's metric (the same
// extproc.Metrics serve registers), by the state it moved to; an approve
// that leaves it waiting for a second approver, a repeated approve, a
// refused self-approval and a decision on a decided approval move nothing.
func TestDecisionsCountTransitions(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics := extproc.NewMetrics(reg)
	f := newFixtureWith(t, memory.New(memory.Options{}), metrics.ApprovalTransition)
	soon := time.Now().Add(5 * time.Minute)
	alice, bob, requester := f.token(f.key, "alice", soon), f.token(f.key, "bob", soon), f.token(f.key, "agent-user", soon)
	approve := func(id, tok string) int {
		code, _ := f.call(t, "POST", "/v1/approvals/"+id+"/approve", tok, `{"reason":"checked"}`)
		return code
	}

	a := f.request(t, "agent-user")
	require.Equal(t, http.StatusForbidden, approve(a.ID, requester), "self-approval")
	require.Equal(t, http.StatusOK, approve(a.ID, alice))
	require.Empty(t, transitions(t, reg), "one of the two required approvers: still pending")
	require.Equal(t, http.StatusOK, approve(a.ID, alice))
	require.Empty(t, transitions(t, reg), "alice counts once")
	require.Equal(t, http.StatusOK, approve(a.ID, bob))
	require.Equal(t, map[string]float64{"approved": 1}, transitions(t, reg))
	require.Equal(t, http.StatusOK, approve(a.ID, bob), "a repeated approve after APPROVED")
	require.Equal(t, map[string]float64{"approved": 1}, transitions(t, reg))

	b := f.request(t, "agent-user")
	code, _ := f.call(t, "POST", "/v1/approvals/"+b.ID+"/deny", bob, `{"reason":"unknown payee"}`)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, http.StatusConflict, approve(b.ID, alice), "denied is final")
	require.Equal(t, map[string]float64{"approved": 1, "denied": 1}, transitions(t, reg))
}
