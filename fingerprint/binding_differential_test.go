package fingerprint_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// differentialCase is one body handed to a real parser.
type differentialCase struct {
	ID        string `json:"id"`
	BodyB64   string `json:"body_b64"`
	Amount    string `json:"amount"`
	Currency  string `json:"currency"`
	AccountID string `json:"account_id"`
	// Control cases are bodies idemgate refuses and that the parser reads
	// differently: they prove the script compares for real.
	control bool
	body    []byte
}

type differentialResult struct {
	ID      string `json:"id"`
	Reader  string `json:"reader"`
	Verdict string `json:"verdict"`
	Got     string `json:"got"`
}

// readCorpus returns the inputs of FuzzBinding's committed corpus
// (testdata/fuzz/FuzzBinding, "go test fuzz v1" files).
func readCorpus(t *testing.T) []bindingSeed {
	t.Helper()
	files, err := filepath.Glob("testdata/fuzz/FuzzBinding/*")
	require.NoError(t, err)
	require.NotEmpty(t, files, "the committed corpus is missing")
	var out []bindingSeed
	for _, name := range files {
		raw, err := os.ReadFile(name)
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
		require.Equal(t, "go test fuzz v1", lines[0], name)
		require.Len(t, lines, 3, name)
		var vals [][]byte
		for _, l := range lines[1:] {
			q, ok := strings.CutPrefix(l, "[]byte(")
			require.True(t, ok, "%s: %s", name, l)
			s, err := strconv.Unquote(strings.TrimSuffix(q, ")"))
			require.NoError(t, err, name)
			vals = append(vals, []byte(s))
		}
		out = append(out, bindingSeed{vals[0], vals[1]})
	}
	return out
}

// differentialCases are the bodies idemgate accepts for the previewed
// fingerprint, from the seeds and the committed corpus, plus the controls.
func differentialCases(t *testing.T) []differentialCase {
	fx := newBindingFixture(t)
	seen := map[string]bool{}
	var cases []differentialCase
	add := func(b []byte, control bool) {
		if seen[string(b)] {
			return
		}
		seen[string(b)] = true
		cases = append(cases, differentialCase{
			ID: strconv.Itoa(len(cases)), BodyB64: base64.StdEncoding.EncodeToString(b),
			Amount: "250.00", Currency: "EUR", AccountID: "acc_caf\u00e9", control: control, body: b,
		})
	}
	for _, s := range append(bindingSeeds(), readCorpus(t)...) {
		for _, b := range bindingBodies(s.body, s.ops) {
			if fx.accepts(b) {
				add(b, false)
			}
		}
	}
	for _, b := range []string{
		// Duplicates: every parser here keeps the last one.
		`{"amount":"250.00","amount":"2500.00","currency":"EUR","payee":{"account_id":"acc_caf\u00e9"}}`,
		`{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_caf\u00e9"},"payee":{"account_id":"acc_EVIL"}}`,
		// A lone surrogate: Python and JavaScript keep it.
		`{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_caf\u00e9\ud800"}}`,
		// NFD: another account id to every parser (idemgate compares bytes).
		`{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_cafe\u0301"}}`,
	} {
		require.False(t, fx.accepts([]byte(b)), b)
		add([]byte(b), true)
	}
	return cases
}

// requireTool finds a parser's runtime; missing, the test skips, or fails
// under IDEMGATE_REQUIRE_SERVICES=1 (CI, make test).
func requireTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("IDEMGATE_REQUIRE_SERVICES") == "1" {
			t.Fatalf("%s is required for the differential test (IDEMGATE_REQUIRE_SERVICES=1): %v", name, err)
		}
		t.Skipf("%s not found: %v", name, err)
	}
	return p
}

// TestBindingDifferential holds the binding rule against Python's json and
// Node's JSON.parse: every body idemgate accepts for the previewed
// fingerprint (seeds and committed corpus of FuzzBinding) is read by them as
// the previewed values, or refused; the controls are read otherwise.
func TestBindingDifferential(t *testing.T) {
	cases := differentialCases(t)
	accepted := 0
	for _, c := range cases {
		if !c.control {
			accepted++
		}
	}
	require.Greater(t, accepted, 200, "too few accepted bodies to be a test")
	in, err := json.Marshal(cases)
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "cases.json")
	require.NoError(t, os.WriteFile(file, in, 0o600))

	for _, r := range []struct{ tool, script string }{
		{"python3", "testdata/differential/check.py"},
		{"node", "testdata/differential/check.js"},
	} {
		t.Run(r.tool, func(t *testing.T) {
			bin := requireTool(t, r.tool)
			cmd := exec.CommandContext(t.Context(), bin, r.script, file)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			require.NoError(t, err, "stderr: %s", stderr.String())
			results := map[string][]differentialResult{}
			sc := bufio.NewScanner(bytes.NewReader(out))
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				var res differentialResult
				require.NoError(t, json.Unmarshal(sc.Bytes(), &res), sc.Text())
				results[res.ID] = append(results[res.ID], res)
			}
			require.NoError(t, sc.Err())
			readers := map[string]bool{}
			for _, c := range cases {
				got := results[c.ID]
				require.NotEmpty(t, got, "no verdict for case %s", c.ID)
				for _, res := range got {
					readers[res.Reader] = true
					if c.control {
						require.NotEqual(t, "same", res.Verdict, "control %q: %s reads the previewed values, so the check proves nothing", c.body, res.Reader)
						continue
					}
					require.NotEqual(t, "differs", res.Verdict, fmt.Sprintf("idemgate accepts %q for the previewed fingerprint, %s reads %s", c.body, res.Reader, res.Got))
				}
			}
			t.Logf("%d accepted bodies and %d controls through %v", accepted, len(cases)-accepted, readers)
		})
	}
}
