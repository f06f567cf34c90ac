package mainlib

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/postgres"
)

// opsTimeout bounds every reconciliation command.
const opsTimeout = 30 * time.Second

// dbFlags are the ways to name the PostgreSQL database: a DSN, or the
// config file (loaded in full, so its secrets must be in the environment).
type dbFlags struct {
	config *string
	dsn    *string
}

func addDBFlags(fs *flag.FlagSet) dbFlags {
	return dbFlags{
		config: fs.String("config", "", "idemgate config file (store.postgres is used)"),
		dsn:    fs.String("dsn", "", "PostgreSQL DSN (instead of --config)"),
	}
}

// resolve returns the DSN and, when a config was given, its terminal TTL.
func (f dbFlags) resolve(stderr io.Writer) (dsn string, terminal time.Duration, err error) {
	switch {
	case *f.dsn != "" && *f.config != "":
		fmt.Fprintln(stderr, "give --dsn or --config, not both")
		return "", 0, ErrUsage
	case *f.dsn != "":
		return *f.dsn, config.DefaultTerminalTTL, nil
	case *f.config != "":
		cfg, _, err := settings.Load(*f.config, config.Options{})
		if err != nil {
			var p *config.Problem
			if errors.As(err, &p) {
				return "", 0, problemsError(*f.config, err)
			}
			return "", 0, err
		}
		if cfg.Store.Postgres == nil {
			return "", 0, fmt.Errorf("%s configures no store.postgres", *f.config)
		}
		return cfg.Store.Postgres.DSN.Reveal(), cfg.Runtime.TTL.Terminal, nil
	default:
		fmt.Fprintln(stderr, "--dsn or --config is required")
		return "", 0, ErrUsage
	}
}

func migrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("migrate", stderr)
	db := addDBFlags(fs)
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	dsn, _, err := db.resolve(stderr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, opsTimeout)
	defer cancel()
	if err := postgres.Migrate(ctx, dsn); err != nil {
		return fmt.Errorf("failed to migrate: %w", err)
	}
	_, err = fmt.Fprintln(stdout, "migrations applied")
	return err
}

func ops(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return ErrUsage
	}
	switch args[0] {
	case "list":
		return opsList(ctx, args[1:], stdout, stderr)
	case "show":
		return opsShow(ctx, args[1:], stdout, stderr)
	case "resolve":
		return opsResolve(ctx, args[1:], stdout, stderr)
	case "approvals":
		return opsApprovals(ctx, args[1:], stdout, stderr)
	default:
		fmt.Fprintf(stderr, "unknown ops command %q\n\n%s", args[0], usage)
		return ErrUsage
	}
}

// withPostgres runs fn against the PostgreSQL store the flags name, the
// whole command bounded by opsTimeout; terminal is ttl.terminal (the
// retention a resolved record gets).
func (f dbFlags) withPostgres(ctx context.Context, stderr io.Writer, fn func(ctx context.Context, pg *postgres.Store, terminal time.Duration) error) error {
	dsn, terminal, err := f.resolve(stderr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, opsTimeout)
	defer cancel()
	pg, err := postgres.New(ctx, postgres.Options{DSN: dsn, MaxConns: 2, MinConns: 1})
	if err != nil {
		return fmt.Errorf("failed to open PostgreSQL: %w", err)
	}
	defer pg.Close()
	return fn(ctx, pg, terminal)
}

func parseState(s string) (state.RecordState, error) {
	switch st := state.RecordState(strings.ToUpper(s)); st {
	case "", state.InFlight, state.Unknown, state.Done, state.Failed:
		return st, nil
	}
	return "", fmt.Errorf("unknown state %q (known: UNKNOWN, IN_FLIGHT, DONE, FAILED)", s)
}

func opsList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ops list", stderr)
	db := addDBFlags(fs)
	stateFlag := fs.String("state", "UNKNOWN", "UNKNOWN, IN_FLIGHT, DONE, FAILED or empty for all")
	olderThan := fs.Duration("older-than", 0, "only records not updated for at least this long")
	limit := fs.Int("limit", 100, "at most this many records")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	st, err := parseState(*stateFlag)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return ErrUsage
	}
	var recs []state.Record
	err = db.withPostgres(ctx, stderr, func(ctx context.Context, pg *postgres.Store, _ time.Duration) (err error) {
		recs, err = pg.List(ctx, postgres.ListFilter{State: st, OlderThan: *olderThan, Limit: *limit})
		return err
	})
	if err != nil {
		return fmt.Errorf("failed to list records: %w", err)
	}
	tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NONCE\tSTATE\tSCOPE\tUPDATED\tCREATED\tOWNER\tFENCE")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\n", r.Key, r.State, r.Scope,
			r.UpdatedAt.UTC().Format(time.RFC3339), r.CreatedAt.UTC().Format(time.RFC3339), r.Owner, r.Fence)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "%d record(s)\n", len(recs))
	return nil
}

func opsShow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ops show", stderr)
	db := addDBFlags(fs)
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fmt.Fprintln(stderr, "ops show: give exactly one NONCE")
		return ErrUsage
	}
	var (
		rec         state.Record
		found       bool
		resolutions []postgres.Resolution
	)
	err = db.withPostgres(ctx, stderr, func(ctx context.Context, pg *postgres.Store, _ time.Duration) (err error) {
		if rec, found, err = pg.Get(ctx, pos[0]); err != nil || !found {
			return err
		}
		resolutions, err = pg.Resolutions(ctx, pos[0])
		return err
	})
	if err != nil {
		return fmt.Errorf("failed to read %s: %w", pos[0], err)
	}
	if !found {
		return fmt.Errorf("no record %s", pos[0])
	}
	writeRecord(stdout, rec)
	for _, r := range resolutions {
		fmt.Fprintf(stdout, "resolved      %s as %s (%d) by %s: %s\n", r.At.UTC().Format(time.RFC3339), r.State, r.Status, r.Actor, r.Reason)
	}
	return nil
}

func writeRecord(w io.Writer, r state.Record) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "nonce\t%s\n", r.Key)
	fmt.Fprintf(tw, "state\t%s\n", r.State)
	fmt.Fprintf(tw, "scope\t%s\n", r.Scope)
	fmt.Fprintf(tw, "subject tag\t%s\n", r.SubjectTag)
	fmt.Fprintf(tw, "param hash\t%s\n", r.ParamHash)
	fmt.Fprintf(tw, "owner\t%s (fence %d)\n", r.Owner, r.Fence)
	fmt.Fprintf(tw, "lease until\t%s (expired: %t)\n", r.LeaseUntil.UTC().Format(time.RFC3339), r.LeaseExpired)
	fmt.Fprintf(tw, "created\t%s\n", r.CreatedAt.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "updated\t%s\n", r.UpdatedAt.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "expires\t%s\n", r.ExpiresAt.UTC().Format(time.RFC3339))
	if res := r.Result; res != nil {
		fmt.Fprintf(tw, "result status\t%d\n", res.Status)
		for _, h := range res.Headers {
			fmt.Fprintf(tw, "result header\t%s: %s\n", h.Name, h.Value)
		}
		if utf8.Valid(res.Body) {
			fmt.Fprintf(tw, "result body\t%s\n", res.Body)
		} else {
			fmt.Fprintf(tw, "result body\t(%d bytes, not UTF-8)\n", len(res.Body))
		}
	}
	_ = tw.Flush()
}

func opsResolve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ops resolve", stderr)
	db := addDBFlags(fs)
	done := fs.Bool("done", false, "the operation was executed")
	failed := fs.Bool("failed", false, "the operation was not executed")
	status := fs.Int("status", 0, "HTTP status replayed to later confirms")
	body := fs.String("body", "", "result body replayed to later confirms: @FILE or the text itself")
	contentType := fs.String("content-type", "application/json", "content-type of the body")
	as := fs.String("as", "", "who settles the record (recorded; required)")
	reason := fs.String("reason", "", "how it was verified (recorded; required)")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) != 1:
		fmt.Fprintln(stderr, "ops resolve: give exactly one NONCE")
		return ErrUsage
	case strings.TrimSpace(*as) == "" || strings.TrimSpace(*reason) == "":
		fmt.Fprintln(stderr, "ops resolve: --as and --reason are required (they are recorded with the resolution)")
		return ErrUsage
	case *done == *failed:
		fmt.Fprintln(stderr, "ops resolve: give exactly one of --done and --failed")
		return ErrUsage
	case *status < 100 || *status > 599:
		fmt.Fprintln(stderr, "ops resolve: --status must be an HTTP status (e.g. 201 for --done, 422 for --failed)")
		return ErrUsage
	}
	payload := []byte(*body)
	if name, isFile := strings.CutPrefix(*body, "@"); isFile {
		if payload, err = os.ReadFile(name); err != nil {
			return fmt.Errorf("failed to read the body: %w", err)
		}
	}
	st := state.Done
	if *failed {
		st = state.Failed
	}
	res := state.Result{Status: *status, Body: payload}
	if len(payload) > 0 && *contentType != "" {
		res.Headers = []state.Header{{Name: "content-type", Value: *contentType}}
	}
	var ans state.Answer
	err = db.withPostgres(ctx, stderr, func(ctx context.Context, pg *postgres.Store, terminal time.Duration) (err error) {
		ans, err = pg.ResolveAs(ctx, pos[0], state.Completion{State: st, Result: res, Retention: terminal}, strings.TrimSpace(*as), *reason)
		return err
	})
	if err != nil {
		return fmt.Errorf("failed to resolve %s: %w", pos[0], err)
	}
	switch ans.Outcome {
	case state.OutcomeOK:
		fmt.Fprintf(stdout, "resolved %s as %s (%d)\n", pos[0], st, *status)
		return nil
	case state.OutcomeNotFound:
		return fmt.Errorf("no record %s", pos[0])
	case state.OutcomeNotOwner:
		return fmt.Errorf("record %s is already %s; left unchanged", pos[0], ans.Record.State)
	}
	return fmt.Errorf("unexpected answer %s", ans.Outcome)
}
