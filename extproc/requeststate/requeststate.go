// Package requeststate seals the requestState idemgate hands an MCP client
// with an approval's input request (docs/design.md §13) and opens it when
// the client retries. The client echoes it untouched, but it travels
// through the agent, so on return it is attacker-controlled: it is
// accepted only with a valid HMAC under idemgate's own key (derived from
// the fingerprint signing keys, so rotation works as for fingerprints),
// before its expiry, and the caller still checks that it names the nonce,
// subject and approval of the call that carries it.
//
// Wire form: "igs1." kid "." base64url(payload) "." base64url(mac), where
// payload is nonce, approval id, subject tag and expiry (unix seconds),
// one per line, and mac is HMAC-SHA256 over everything before its dot.
package requeststate

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemgate/idemgate/fingerprint"
)

// Label is the HKDF label of the sealing key.
const Label = "idemgate/mcp/v1/request-state"

const prefix = "igs1."

// MaxLen bounds a state read back: what Seal makes is far shorter.
const MaxLen = 512

// ErrInvalid is wrapped by every reason a state is refused.
var ErrInvalid = errors.New("invalid requestState")

// State is what a sealed requestState binds.
type State struct {
	Nonce      string
	ApprovalID string
	SubjectTag string
	Expires    time.Time
}

// Sealer seals and opens states.
type Sealer struct {
	active string
	keys   map[string][]byte
}

// New derives the sealing keys from the fingerprint key ring.
func New(ring *fingerprint.KeyRing) (*Sealer, error) {
	keys, err := ring.DeriveKeys(Label)
	if err != nil {
		return nil, err
	}
	return &Sealer{active: ring.ActiveKeyID(), keys: keys}, nil
}

// Seal returns the wire form of st under the active key.
func (s *Sealer) Seal(st State) (string, error) {
	for _, f := range []string{st.Nonce, st.ApprovalID, st.SubjectTag} {
		if f == "" || !plain(f) {
			return "", fmt.Errorf("%w: a bound field is empty or not plain", ErrInvalid)
		}
	}
	payload := st.Nonce + "\n" + st.ApprovalID + "\n" + st.SubjectTag + "\n" + strconv.FormatInt(st.Expires.Unix(), 10)
	signed := prefix + s.active + "." + base64.RawURLEncoding.EncodeToString([]byte(payload))
	return signed + "." + base64.RawURLEncoding.EncodeToString(s.mac(s.keys[s.active], signed)), nil
}

// Open verifies wire and returns its state. Any defect, a key the ring no
// longer has, and a state at or past its expiry are ErrInvalid.
func (s *Sealer) Open(wire string, now time.Time) (State, error) {
	if len(wire) > MaxLen {
		return State{}, fmt.Errorf("%w: too long", ErrInvalid)
	}
	rest, ok := strings.CutPrefix(wire, prefix)
	if !ok {
		return State{}, fmt.Errorf("%w: not idemgate's", ErrInvalid)
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 {
		return State{}, fmt.Errorf("%w: malformed", ErrInvalid)
	}
	key, ok := s.keys[parts[0]]
	if !ok {
		return State{}, fmt.Errorf("%w: unknown key", ErrInvalid)
	}
	mac, err := base64.RawURLEncoding.Strict().DecodeString(parts[2])
	if err != nil {
		return State{}, fmt.Errorf("%w: malformed mac", ErrInvalid)
	}
	signed := wire[:len(wire)-len(parts[2])-1]
	if !hmac.Equal(mac, s.mac(key, signed)) {
		return State{}, fmt.Errorf("%w: mac does not verify", ErrInvalid)
	}
	payload, err := base64.RawURLEncoding.Strict().DecodeString(parts[1])
	if err != nil {
		return State{}, fmt.Errorf("%w: malformed payload", ErrInvalid)
	}
	fields := strings.Split(string(payload), "\n")
	if len(fields) != 4 {
		return State{}, fmt.Errorf("%w: malformed payload", ErrInvalid)
	}
	exp, err := strconv.ParseInt(fields[3], 10, 64)
	if err != nil {
		return State{}, fmt.Errorf("%w: malformed expiry", ErrInvalid)
	}
	st := State{Nonce: fields[0], ApprovalID: fields[1], SubjectTag: fields[2], Expires: time.Unix(exp, 0)}
	if !now.Before(st.Expires) {
		return State{}, fmt.Errorf("%w: expired", ErrInvalid)
	}
	return st, nil
}

func (s *Sealer) mac(key []byte, signed string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(signed))
	return h.Sum(nil)
}

// plain reports whether a bound field is visible ASCII without the payload's
// separator.
func plain(f string) bool {
	for i := 0; i < len(f); i++ {
		if f[i] <= ' ' || f[i] > '~' {
			return false
		}
	}
	return true
}
