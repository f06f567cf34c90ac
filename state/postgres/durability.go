package postgres

import (
	"context"
	"fmt"
	"strings"

	"github.com/idemgate/idemgate/state"
)

// DurabilityWarning says, from what PostgreSQL reports, whether a commit
// idemgate acknowledges (an agent told DONE) can vanish in a failover, and
// why; empty when it cannot. A commit survives the loss of the primary only
// when a synchronous standby has it: synchronous_standby_names names one
// and synchronous_commit waits for it (on, remote_write, remote_apply).
// With an asynchronous standby an acknowledged DONE can be missing on the
// promoted one, and a retry executes again (the failover tests show it).
//
// It is a warning, not a refusal: managed services that replicate below
// PostgreSQL (Amazon Aurora, Cloud SQL with HA) report no standby yet lose
// no commit.
func (s *Store) DurabilityWarning(ctx context.Context) (string, error) {
	var (
		commit, names string
		syncStandbys  int
	)
	err := s.pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
		(SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))::int`).Scan(&commit, &names, &syncStandbys)
	if err != nil {
		return "", state.Unavailable("read postgres replication settings", err)
	}
	const consequence = "a failover can lose DONE records the agents were told about, and their retries would execute again; " +
		"set synchronous_standby_names to a streaming standby (or use a managed HA mode that loses no commit) — see docs/scaling.md"
	switch {
	case strings.TrimSpace(names) == "":
		return "PostgreSQL reports no synchronous standby (synchronous_standby_names is empty): " + consequence, nil
	case commit == "off" || commit == "local":
		return fmt.Sprintf("PostgreSQL's synchronous_commit is %s, which does not wait for the synchronous standby: %s", commit, consequence), nil
	case syncStandbys == 0:
		return fmt.Sprintf("PostgreSQL names synchronous standbys (%s) but none is streaming now: commits wait for one, so confirms time out until it is back", names), nil
	}
	return "", nil
}
