package check

import (
	"regexp"
	"strings"
	"testing"
)

var heading = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)

// runbookAnchors returns the anchors GitHub gives docs/runbooks.md's
// headings: lower case, punctuation other than - and _ dropped, spaces as -.
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	anchors := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(string(readFile(t, runbooksFile)), -1) {
		anchors[githubAnchor(m[1])] = true
	}
	return anchors
}

func githubAnchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// TestEveryAlertHasARunbookSection: docs/runbooks.md has a section named
// after each alert, and each says what it means for money, how to confirm,
// what to do and when to escalate.
func TestEveryAlertHasARunbookSection(t *testing.T) {
	doc := string(readFile(t, runbooksFile))
	sections := map[string]string{}
	locs := heading.FindAllStringSubmatchIndex(doc, -1)
	for i, l := range locs {
		end := len(doc)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		sections[doc[l[2]:l[3]]] = doc[l[1]:end]
	}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			body, ok := sections[r.Alert]
			if !ok {
				t.Errorf("docs/runbooks.md has no section headed %s", r.Alert)
				continue
			}
			for _, part := range []string{"**Money:**", "**Confirm:**", "**Do:**", "**Escalate:**"} {
				if !strings.Contains(body, part) {
					t.Errorf("docs/runbooks.md § %s: no %s paragraph", r.Alert, part)
				}
			}
		}
	}
}

func TestGithubAnchor(t *testing.T) {
	for h, want := range map[string]string{
		"IdemgateRecordsUnknown":  "idemgaterecordsunknown",
		"Before you start: tools": "before-you-start-tools",
	} {
		if got := githubAnchor(h); got != want {
			t.Errorf("githubAnchor(%q) = %q, want %q", h, got, want)
		}
	}
}
