// Package approvalnotify tells people of a new approval (docs/design.md
// §10): one POST of {"type": "approval.requested", "approval": <approval>}
// per approval, signed as Standard Webhooks do (webhook-id,
// webhook-timestamp, webhook-signature: v1,<base64 HMAC-SHA256(key,
// id.timestamp.body)>), retried with exponential backoff until the
// approval lapses, never in the agent's way: Requested only queues. A
// delivery appends a "notified" event to the approval. The queue lives in
// the process: a restart forgets undelivered notices (approvers can still
// list pending approvals).
package approvalnotify

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/idemgate/idemgate/extproc/approvalapi"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/state"
)

// Options configure a Notifier.
type Options struct {
	// Approvals records the notified events.
	Approvals state.Approvals
	Logger    *slog.Logger
	Client    *http.Client
	// QueueSize bounds the notices waiting (default 1000); beyond it a
	// notice is dropped and logged.
	QueueSize int
	// Workers deliver in parallel (default 2).
	Workers int
	// FirstBackoff and MaxBackoff shape the retries (defaults 1s, 5m).
	FirstBackoff, MaxBackoff time.Duration
	// Timeout bounds one attempt (default 5s).
	Timeout time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// OnResult counts deliveries: sent, failed (gave up), dropped.
	OnResult func(result string)
}

// Notifier delivers notices in the background.
type Notifier struct {
	opts   Options
	queue  chan notice
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type notice struct {
	url      string
	key      []byte
	id       string
	body     []byte
	deadline time.Time
}

// New starts the workers; Close stops them.
func New(opts Options) *Notifier {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Client == nil {
		opts.Client = &http.Client{}
	}
	if opts.QueueSize <= 0 {
		opts.QueueSize = 1000
	}
	if opts.Workers <= 0 {
		opts.Workers = 2
	}
	if opts.FirstBackoff <= 0 {
		opts.FirstBackoff = time.Second
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 5 * time.Minute
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Notifier{opts: opts, queue: make(chan notice, opts.QueueSize), ctx: ctx, cancel: cancel}
	for range opts.Workers {
		n.wg.Add(1)
		go n.work()
	}
	return n
}

// Close stops delivering (notices still queued are dropped) and waits for
// the workers.
func (n *Notifier) Close() {
	n.cancel()
	n.wg.Wait()
}

// Requested queues the notice of a new approval of op (a no-op when op
// has no webhook). It never blocks.
func (n *Notifier) Requested(a state.Approval, op *config.Operation) {
	if op.Approval == nil || op.Approval.Notify == nil {
		return
	}
	body, err := json.Marshal(map[string]any{"type": "approval.requested", "approval": approvalapi.ViewOf(&a)})
	if err != nil {
		n.opts.Logger.Error("failed to render an approval notice", "approval_id", a.ID, "error", err)
		return
	}
	nt := notice{url: op.Approval.Notify.URL, key: op.Approval.Notify.Key, id: a.ID, body: body, deadline: a.ExpiresAt}
	select {
	case n.queue <- nt:
	default:
		n.opts.Logger.Warn("approval notice dropped: the queue is full", "approval_id", a.ID)
		n.result("dropped")
	}
}

func (n *Notifier) result(r string) {
	if n.opts.OnResult != nil {
		n.opts.OnResult(r)
	}
}

func (n *Notifier) work() {
	defer n.wg.Done()
	for {
		select {
		case <-n.ctx.Done():
			return
		case nt := <-n.queue:
			n.deliver(nt)
		}
	}
}

// deliver sends nt until it is accepted (2xx), the approval lapses or the
// notifier closes.
func (n *Notifier) deliver(nt notice) {
	backoff := n.opts.FirstBackoff
	for attempt := 1; ; attempt++ {
		err := n.send(nt)
		if err == nil {
			n.result("sent")
			ctx, cancel := context.WithTimeout(n.ctx, n.opts.Timeout)
			if _, err := n.opts.Approvals.RecordNotified(ctx, nt.id, nt.url); err != nil {
				n.opts.Logger.Warn("failed to record an approval notice", "approval_id", nt.id, "error", err)
			}
			cancel()
			return
		}
		wait := backoff
		if next := n.opts.Now().Add(wait); !next.Before(nt.deadline) {
			n.opts.Logger.Warn("approval notice given up: the approval lapses before the next attempt", "approval_id", nt.id, "attempts", attempt, "error", err)
			n.result("failed")
			return
		}
		n.opts.Logger.Info("approval notice failed; retrying", "approval_id", nt.id, "attempt", attempt, "retry_in", wait, "error", err)
		select {
		case <-n.ctx.Done():
			return
		case <-time.After(wait):
		}
		backoff = min(backoff*2, n.opts.MaxBackoff)
	}
}

func (n *Notifier) send(nt notice) error {
	ctx, cancel := context.WithTimeout(n.ctx, n.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, nt.url, bytes.NewReader(nt.body))
	if err != nil {
		return err
	}
	ts := strconv.FormatInt(n.opts.Now().Unix(), 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("webhook-id", nt.id)
	req.Header.Set("webhook-timestamp", ts)
	req.Header.Set("webhook-signature", Sign(nt.key, nt.id, ts, nt.body))
	resp, err := n.opts.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}

// Sign is the Standard Webhooks signature header value of one message.
func Sign(key []byte, id, timestamp string, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + timestamp + "."))
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}
