package config

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Outcome is how an upstream answer settles a confirm's record.
type Outcome uint8

const (
	// OutcomeNone: no upstream answer (yet).
	OutcomeNone Outcome = iota
	// OutcomeDone: the operation happened; the record becomes DONE.
	OutcomeDone
	// OutcomeFailed: the operation definitely did not happen and the
	// answer is final; the record becomes FAILED and is replayed.
	OutcomeFailed
	// OutcomeAmbiguous: the operation may or may not have happened; the
	// record is released (downstream honours keys) or becomes UNKNOWN.
	OutcomeAmbiguous
)

func (o Outcome) String() string {
	switch o {
	case OutcomeDone:
		return "done"
	case OutcomeFailed:
		return "failed"
	case OutcomeAmbiguous:
		return "ambiguous"
	}
	return "none"
}

// Outcomes maps upstream HTTP statuses to outcome classes: the defaults of
// docs/design.md §3, overridden per operation by `outcomes`. The zero value
// is the defaults.
//
// Defaults: 2xx done; 3xx and 4xx failed, except 408 (request timeout), 409
// (many payment APIs' "a request with this key is still in progress"), 425
// (too early) and 429 (rate limited), which say nothing about whether an
// earlier attempt ran; 5xx and anything else ambiguous. A redirect does not
// execute the operation, so replaying it as a failure is harmless.
type Outcomes struct {
	exact   map[int]Outcome
	hundred [6]Outcome // index status/100; OutcomeNone: the default
}

// Classify returns the class of an upstream status: an exact override, else
// a range override, else the default.
func (o *Outcomes) Classify(status int) Outcome {
	if c, ok := o.exact[status]; ok {
		return c
	}
	if status >= 200 && status <= 599 {
		if c := o.hundred[status/100]; c != OutcomeNone {
			return c
		}
	}
	return defaultOutcome(status)
}

func defaultOutcome(status int) Outcome {
	switch {
	case status >= 200 && status <= 299:
		return OutcomeDone
	case status == 408 || status == 409 || status == 425 || status == 429:
		return OutcomeAmbiguous
	case status >= 300 && status <= 499:
		return OutcomeFailed
	default:
		return OutcomeAmbiguous
	}
}

// Overrides lists the configured overrides as "409 failed", ranges after
// exact codes, for check-config's summary.
func (o *Outcomes) Overrides() []string {
	var out []string
	codes := make([]int, 0, len(o.exact))
	for c := range o.exact {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	for _, c := range codes {
		out = append(out, fmt.Sprintf("%d %s", c, o.exact[c]))
	}
	for h, c := range o.hundred {
		if c != OutcomeNone {
			out = append(out, fmt.Sprintf("%dxx %s", h, c))
		}
	}
	return out
}

// outcomes compiles an operation's `outcomes` mapping: keys are a status
// ("409") or a range ("5xx"), values done, failed or ambiguous. Only a 2xx
// may be done and no 2xx may be failed: recording an error as a success, or
// a success as a refusal, would replay the wrong story to every retry.
func (c *compiler) outcomes(spec map[string]string, at func(...any) []any) Outcomes {
	var o Outcomes
	keys := make([]string, 0, len(spec))
	for k := range spec {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := spec[k]
		path := at("outcomes", k)
		var class Outcome
		switch v {
		case "done":
			class = OutcomeDone
		case "failed":
			class = OutcomeFailed
		case "ambiguous":
			class = OutcomeAmbiguous
		default:
			c.errorf(path, "unknown outcome %q (known: done, failed, ambiguous)", v)
			continue
		}
		hundred, code, ok := parseStatusKey(k)
		if !ok {
			c.errorf(path, "%q is neither an HTTP status (200-599) nor a range like 4xx (2xx-5xx)", k)
			continue
		}
		switch {
		case class == OutcomeDone && hundred != 2:
			c.errorf(path, "only a 2xx may be done: a %s answer recorded as done would be replayed as a success", k)
			continue
		case class == OutcomeFailed && hundred == 2:
			c.errorf(path, "a 2xx may not be failed: the upstream executed the operation")
			continue
		}
		if code == 0 {
			o.hundred[hundred] = class
			continue
		}
		if o.exact == nil {
			o.exact = map[int]Outcome{}
		}
		o.exact[code] = class
	}
	return o
}

// parseStatusKey reads "409" (code 409) or "4xx" (code 0), both hundred 4.
func parseStatusKey(k string) (hundred, code int, ok bool) {
	if len(k) != 3 || k[0] < '2' || k[0] > '5' {
		return 0, 0, false
	}
	hundred = int(k[0] - '0')
	if strings.EqualFold(k[1:], "xx") {
		return hundred, 0, true
	}
	n, err := strconv.Atoi(k)
	if err != nil || k[1] < '0' || k[1] > '9' || k[2] < '0' || k[2] > '9' {
		return 0, 0, false
	}
	return hundred, n, true
}
