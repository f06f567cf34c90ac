package oracle

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	script      = "fingerprint_oracle.py"
	vectorsPath = "../testdata/vectors.json"
)

// python3 returns the interpreter's path. Without one the oracle cannot run:
// under IDEMGATE_REQUIRE_SERVICES (make test, CI) that is a failure, since a
// skipped oracle would let the vectors drift from the written rules unseen.
func python3(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("IDEMGATE_REQUIRE_SERVICES") != "" {
			t.Fatalf("python3 is required to run the fingerprint oracle but was not found: %v", err)
		}
		t.Skipf("python3 not found (%v); the fingerprint oracle needs it", err)
	}
	return p
}

// runOracle runs the oracle on a vectors file and returns its output and exit
// code. -I keeps the user's PYTHON* variables and site packages out of it.
func runOracle(t *testing.T, vectors string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python3(t), "-I", script, vectors)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &exit) && exit.ExitCode() > 0:
		return out.String(), exit.ExitCode()
	default:
		t.Fatalf("running the oracle: %v\n%s", err, out.String())
		return "", -1
	}
}

var summary = regexp.MustCompile(`(?m)^oracle: (\d+) passed, (\d+) failed$`)

// counts reads the oracle's closing line.
func counts(t *testing.T, out string) (passed, failed int) {
	t.Helper()
	m := summary.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the oracle printed no closing line:\n%s", out)
	}
	// The regexp admits digits only, so the conversions cannot fail.
	passed, _ = strconv.Atoi(m[1])
	failed, _ = strconv.Atoi(m[2])
	return passed, failed
}

func failLines(out string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "FAIL ") {
			lines = append(lines, l)
		}
	}
	return lines
}

// TestOracleRecomputesGoldenVectors is the point of the package: every golden
// vector recomputed by an implementation that shares no code with the one that
// wrote it.
func TestOracleRecomputesGoldenVectors(t *testing.T) {
	out, code := runOracle(t, vectorsPath)
	if code != 0 {
		t.Fatalf("the independent oracle disagrees with testdata/vectors.json (exit %d):\n%s", code, out)
	}
	passed, failed := counts(t, out)
	// An oracle that checked nothing would pass too.
	if passed < 50 || failed != 0 {
		t.Fatalf("oracle: %d passed, %d failed; want at least 50 checks:\n%s", passed, failed, out)
	}
	t.Log(strings.TrimSpace(out))
}

// TestOracleReportsAlteredVectors proves the oracle can fail: one expected
// hash, one token and one number form are altered in a copy of the vectors,
// and it must report exactly those three and nothing else.
func TestOracleReportsAlteredVectors(t *testing.T) {
	raw, err := os.ReadFile(vectorsPath)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // now and exp stay integers when written back
	var v map[string]any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	numbers, _ := v["numbers"].([]any)
	tokens, _ := v["tokens"].([]any)
	if len(numbers) == 0 || len(tokens) == 0 {
		t.Fatalf("vectors.json has no numbers or no tokens")
	}

	// The first number with a canonical form: "1" becomes "10", still a
	// well-formed canonical decimal, just the wrong one.
	numIdx := -1
	for i, n := range numbers {
		if _, ok := n.(map[string]any)["out"]; ok {
			numIdx = i
			break
		}
	}
	if numIdx < 0 {
		t.Fatalf("vectors.json has no number with an \"out\"")
	}
	num := numbers[numIdx].(map[string]any)
	num["out"] = num["out"].(string) + "0"

	// The hash of the first token vector and the token of the last one (the
	// same vector when there is only one), each with its last character changed.
	hashTok := tokens[0].(map[string]any)
	hashExp := hashTok["expected"].(map[string]any)
	hashExp["hash"] = flipLast(hashExp["hash"].(string))
	tokIdx := len(tokens) - 1
	tokTok := tokens[tokIdx].(map[string]any)
	tokExp := tokTok["expected"].(map[string]any)
	tokExp["token"] = flipLast(tokExp["token"].(string))

	altered, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "vectors.json")
	if err := os.WriteFile(path, altered, 0o600); err != nil {
		t.Fatal(err)
	}

	basePassed, baseFailed := counts(t, outputOf(runOracle(t, vectorsPath)))
	out, code := runOracle(t, path)
	if code != 1 {
		t.Fatalf("the oracle exited %d on altered vectors, want 1:\n%s", code, out)
	}
	want := []string{
		fmt.Sprintf("FAIL numbers[%d] in=%q: vector out %q, oracle out ", numIdx, num["in"], num["out"]),
		fmt.Sprintf("FAIL tokens[0] %q: hash: vector %q, oracle ", hashTok["name"], hashExp["hash"]),
		fmt.Sprintf("FAIL tokens[%d] %q: token: vector %q, oracle ", tokIdx, tokTok["name"], tokExp["token"]),
	}
	got := failLines(out)
	if len(got) != len(want) {
		t.Fatalf("the oracle reported %d mismatches, want exactly %d:\n%s", len(got), len(want), out)
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("mismatch %d:\n got  %s\n want %s…", i, got[i], want[i])
		}
	}
	passed, failed := counts(t, out)
	if failed != 3 || passed != basePassed+baseFailed-3 {
		t.Errorf("oracle: %d passed, %d failed; want %d passed, 3 failed", passed, failed, basePassed+baseFailed-3)
	}
}

// outputOf drops the exit code, for a run whose counts are all that matter.
func outputOf(out string, _ int) string { return out }

// flipLast changes a string's last character to another one of the same
// alphabet (hex or base64url), so only the value is wrong, not its form.
func flipLast(s string) string {
	last := s[len(s)-1]
	repl := byte('a')
	if last == 'a' {
		repl = 'b'
	}
	return s[:len(s)-1] + string(repl)
}
