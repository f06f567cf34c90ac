package envoysim

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

type checkOp int

const (
	opSet checkOp = iota
	opAppend
	opRemove
)

type checkResult int

const (
	checkOK checkResult = iota
	checkIgnore
	checkFail
)

// checker is Envoy's MutationRules::Checker (mutation_rules.cc).
type checker struct {
	rules              MutationRules
	allowExpression    *regexp.Regexp
	disallowExpression *regexp.Regexp
}

var routingHeaders = setOf("host", ":authority", ":method", ":scheme")

func newChecker(r MutationRules) (*checker, error) {
	c := &checker{rules: r}
	var err error
	if r.AllowExpression != "" {
		if c.allowExpression, err = regexp.Compile("^(?:" + r.AllowExpression + ")$"); err != nil {
			return nil, fmt.Errorf("allow_expression: %w", err)
		}
	}
	if r.DisallowExpression != "" {
		if c.disallowExpression, err = regexp.Compile("^(?:" + r.DisallowExpression + ")$"); err != nil {
			return nil, fmt.Errorf("disallow_expression: %w", err)
		}
	}
	return c, nil
}

func (c *checker) check(op checkOp, name, value string) checkResult {
	if c.isAllowed(op, name) && (op == opRemove || c.isValidValue(name, value)) {
		return checkOK
	}
	if c.rules.DisallowIsError {
		return checkFail
	}
	return checkIgnore
}

func (c *checker) isAllowed(op checkOp, name string) bool {
	if op == opRemove && (strings.HasPrefix(name, ":") || name == "host") {
		// No matter what, "host" and ":" headers cannot be removed.
		return false
	}
	if c.disallowExpression != nil && c.disallowExpression.MatchString(name) {
		return false
	}
	if c.allowExpression != nil && c.allowExpression.MatchString(name) {
		return true
	}
	if c.rules.DisallowAll {
		return false
	}
	if !c.rules.AllowAllRouting && routingHeaders[name] {
		return false
	}
	if strings.HasPrefix(name, ":") && (op == opAppend || c.rules.DisallowSystem) {
		return false
	}
	if !c.rules.AllowEnvoy && strings.HasPrefix(name, "x-envoy") {
		return false
	}
	return true
}

func (c *checker) isValidValue(name, value string) bool {
	if !strings.HasPrefix(name, ":") && !headerValueIsValid(value) {
		return false
	}
	switch name {
	case "host", ":authority":
		return authorityIsValid(value)
	case ":scheme":
		return value == "http" || value == "https"
	case ":status":
		n, err := strconv.ParseUint(value, 10, 32)
		return err == nil && n >= 200
	}
	return true
}

// mutationError is a rejected mutation; its message becomes the local
// reply's details, as absl::Status messages do in Envoy.
type mutationError struct{ msg string }

func (e *mutationError) Error() string { return e.msg }

// mutationLimits are the HCM limits a mutated header map must respect.
type mutationLimits struct {
	maxCount int
	maxKB    int
}

// applyHeaderMutations is MutationUtils::applyHeaderMutations. rejected is
// called for every refused or ignored mutation (the rejected_header_mutations
// counter).
func applyHeaderMutations(m *extprocv3.HeaderMutation, h *headerMap, replacing bool, c *checker,
	removeContentLength bool, lim mutationLimits, rejected func(),
) error {
	if len(m.GetRemoveHeaders()) > lim.maxCount || len(m.GetSetHeaders()) > lim.maxCount {
		rejected()
		return &mutationError{fmt.Sprintf("Header mutation remove header count %d or set header count %d exceed the HCM header countlimit %d",
			len(m.GetRemoveHeaders()), len(m.GetSetHeaders()), lim.maxCount)}
	}
	for _, name := range m.GetRemoveHeaders() {
		if !headerNameIsValid(name) {
			rejected()
			return &mutationError{"Invalid character in remove_headers mutation."}
		}
		lname := strings.ToLower(name)
		switch c.check(opRemove, lname, "") {
		case checkOK:
			h.remove(lname)
		case checkIgnore:
			rejected()
		case checkFail:
			rejected()
			return &mutationError{"Invalid attempt to remove " + lname}
		}
	}
	for _, sh := range m.GetSetHeaders() {
		hv := sh.GetHeader()
		if hv == nil {
			continue
		}
		if removeContentLength && strings.EqualFold(hv.GetKey(), "content-length") {
			continue
		}
		if hv.GetValue() != "" && len(hv.GetRawValue()) > 0 {
			rejected()
			return &mutationError{"Only one of value or raw_value in the HeaderValue message should be set."}
		}
		// Only raw_value is read: a server that fills value sets "".
		value := string(hv.GetRawValue())
		if !headerNameIsValid(hv.GetKey()) || !headerValueIsValid(value) {
			rejected()
			return &mutationError{"Invalid character in set_headers mutation."}
		}
		name := strings.ToLower(hv.GetKey())
		appendValue := sh.GetAppend().GetValue() // append_action and keep_empty_value are ignored
		op := opSet
		if appendValue && h.has(name) {
			op = opAppend
		}
		res := c.check(op, name, value)
		if replacing && name == ":method" {
			res = checkOK
		}
		switch res {
		case checkOK:
			if appendValue {
				h.addCopy(name, value)
			} else {
				h.setCopy(name, value)
			}
		case checkIgnore:
			rejected()
		case checkFail:
			rejected()
			return &mutationError{"Invalid attempt to modify " + name}
		}
	}
	if h.byteSize() > lim.maxKB*1024 || len(h.entries) > lim.maxCount {
		rejected()
		return &mutationError{fmt.Sprintf("Header mutation causes end result header count %d or header size %d bytes, exceeding the count limit %d or the size limit %d kilobytes",
			len(h.entries), h.byteSize(), lim.maxCount, lim.maxKB)}
	}
	return nil
}

// applyBodyMutation is MutationUtils::applyBodyMutations.
func applyBodyMutation(m *extprocv3.BodyMutation, data []byte) []byte {
	switch mm := m.GetMutation().(type) {
	case *extprocv3.BodyMutation_ClearBody:
		if mm.ClearBody {
			return []byte{}
		}
	case *extprocv3.BodyMutation_Body:
		return append([]byte{}, mm.Body...)
	}
	return data
}

// applyFilterMutations runs header_mutation filter operations, which use the
// full HeaderValueOption semantics (append_action honoured).
func applyFilterMutations(ops []HeaderMutationOp, h *headerMap) {
	for _, op := range ops {
		if op.Remove != "" {
			h.remove(strings.ToLower(op.Remove))
			continue
		}
		a := op.Append
		key := strings.ToLower(a.Key)
		if a.Value == "" && !a.KeepEmptyValue {
			continue
		}
		switch a.AppendAction {
		case corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD:
			h.addCopy(key, a.Value)
		case corev3.HeaderValueOption_ADD_IF_ABSENT:
			if !h.has(key) {
				h.addCopy(key, a.Value)
			}
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD:
			h.setCopy(key, a.Value)
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
			if h.has(key) {
				h.setCopy(key, a.Value)
			}
		}
	}
}
