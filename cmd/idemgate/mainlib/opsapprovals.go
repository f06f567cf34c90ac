package mainlib

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemgate/idemgate/extproc/approvalapi"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/postgres"
)

// opsApprovals is the operators' path to approvals (docs/design.md §10):
// PostgreSQL access is the credential; --as and --reason are required and
// recorded in approval_event like an approver's. The rules are the API's:
// the requester may not approve under distinct_from_requester, a decided
// or lapsed approval is not decided again.
func opsApprovals(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return ErrUsage
	}
	switch args[0] {
	case "list":
		return opsApprovalsList(ctx, args[1:], stdout, stderr)
	case "show":
		return opsApprovalsShow(ctx, args[1:], stdout, stderr)
	case "approve", "deny":
		return opsApprovalsDecide(ctx, args[0] == "approve", args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "unknown ops approvals command %q\n\n%s", args[0], usage)
	return ErrUsage
}

func opsApprovalsList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ops approvals list", stderr)
	db := addDBFlags(fs)
	stateFlag := fs.String("state", "pending", "pending, approved, denied, expired, consumed or empty for all")
	limit := fs.Int("limit", 100, "at most this many approvals")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	f := state.ApprovalFilter{Limit: *limit}
	if *stateFlag != "" {
		st, ok := approvalapi.ParseState(*stateFlag)
		if !ok {
			fmt.Fprintf(stderr, "unknown state %q (known: pending, approved, denied, expired, consumed)\n", *stateFlag)
			return ErrUsage
		}
		f.State = st
	}
	var list []state.Approval
	err := db.withPostgres(ctx, stderr, func(ctx context.Context, pg *postgres.Store, _ time.Duration) (err error) {
		list, err = pg.ListApprovals(ctx, f)
		return err
	})
	if err != nil {
		return fmt.Errorf("failed to list approvals: %w", err)
	}
	tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "APPROVAL\tSTATE\tOPERATION\tREQUESTER\tAPPROVERS\tCREATED\tEXPIRES\tRULES")
	for _, a := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\n", a.ID, strings.ToLower(string(a.State)), a.Operation, a.Requester,
			len(a.Approvers()), a.Required, a.CreatedAt.UTC().Format(time.RFC3339), a.ExpiresAt.UTC().Format(time.RFC3339), strings.Join(a.Rules, "; "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "%d approval(s)\n", len(list))
	return nil
}

func opsApprovalsShow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ops approvals show", stderr)
	db := addDBFlags(fs)
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fmt.Fprintln(stderr, "ops approvals show: give exactly one approval ID")
		return ErrUsage
	}
	var (
		a     state.Approval
		found bool
	)
	err = db.withPostgres(ctx, stderr, func(ctx context.Context, pg *postgres.Store, _ time.Duration) (err error) {
		a, found, err = pg.GetApproval(ctx, pos[0])
		return err
	})
	if err != nil {
		return fmt.Errorf("failed to read %s: %w", pos[0], err)
	}
	if !found {
		return fmt.Errorf("no approval %s", pos[0])
	}
	return writeApproval(stdout, a)
}

// writeApproval prints the approval as the API shows it, then its audit
// trail.
func writeApproval(w io.Writer, a state.Approval) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(approvalapi.ViewOf(&a)); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "nonce\t%s\n", a.Key)
	fmt.Fprintln(tw, "EVENT\tACTOR\tAT\tREASON")
	for _, e := range a.Events {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.Kind, e.Actor, e.At.UTC().Format(time.RFC3339), e.Reason)
	}
	return tw.Flush()
}

func opsApprovalsDecide(ctx context.Context, approve bool, args []string, stdout, stderr io.Writer) error {
	verb := "deny"
	if approve {
		verb = "approve"
	}
	fs := newFlagSet("ops approvals "+verb, stderr)
	db := addDBFlags(fs)
	as := fs.String("as", "", "who decides (recorded; required)")
	reason := fs.String("reason", "", "why (recorded; required)")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fmt.Fprintf(stderr, "ops approvals %s: give exactly one approval ID\n", verb)
		return ErrUsage
	}
	if strings.TrimSpace(*as) == "" || strings.TrimSpace(*reason) == "" {
		fmt.Fprintf(stderr, "ops approvals %s: --as and --reason are required\n", verb)
		return ErrUsage
	}
	var (
		out state.DecisionOutcome
		a   state.Approval
	)
	err = db.withPostgres(ctx, stderr, func(ctx context.Context, pg *postgres.Store, _ time.Duration) (err error) {
		out, a, err = pg.DecideApproval(ctx, state.Decision{ID: pos[0], Approver: strings.TrimSpace(*as), Approve: approve, Reason: *reason})
		return err
	})
	if err != nil {
		return fmt.Errorf("failed to %s %s: %w", verb, pos[0], err)
	}
	switch out {
	case state.DecisionNotFound:
		return fmt.Errorf("no approval %s", pos[0])
	case state.DecisionSelfApproval:
		return fmt.Errorf("%s requested %s and may not approve it (distinct_from_requester); they may deny it", *as, pos[0])
	case state.DecisionNotPending:
		return fmt.Errorf("approval %s is %s, not pending: nothing decided", pos[0], strings.ToLower(string(a.State)))
	}
	fmt.Fprintf(stderr, "%s: %s\n", strings.ToLower(string(out)), strings.ToLower(string(a.State)))
	return writeApproval(stdout, a)
}
