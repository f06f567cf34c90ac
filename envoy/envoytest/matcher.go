package envoytest

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	xdsmatcherv3 "github.com/cncf/xds/go/xds/type/matcher/v3"
	matchingv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/matching/v3"
	matchactionv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/common/matcher/action/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// unwrapMatcher returns the filter an ExtensionWithMatcher wraps, unpacked,
// and its matcher; any other config is returned as is with a nil matcher.
func unwrapMatcher(m proto.Message) (proto.Message, *xdsmatcherv3.Matcher, error) {
	ewm, ok := m.(*matchingv3.ExtensionWithMatcher)
	if !ok {
		return m, nil, nil
	}
	if ewm.GetXdsMatcher() == nil {
		return nil, nil, errors.New("ExtensionWithMatcher without xds_matcher (the deprecated matcher field is not understood here)")
	}
	inner, err := anypb.UnmarshalNew(ewm.GetExtensionConfig().GetTypedConfig(), proto.UnmarshalOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("failed to unpack the wrapped filter %q: %w", ewm.GetExtensionConfig().GetName(), err)
	}
	return inner, ewm.GetXdsMatcher(), nil
}

// RunsFor reports whether a filter wrapped in an ExtensionWithMatcher runs
// for a request with :path path, as Envoy decides it: the first matching
// field matcher's action (or on_no_match), SkipFilter skipping it. A filter
// without a matcher always runs. Only :path inputs, string matchers and
// and/or/not are understood; anything else is an error, never a guess.
func (f Filter) RunsFor(path string) (bool, error) {
	if f.Matcher == nil {
		return true, nil
	}
	return runsFor(f.Matcher, path)
}

func runsFor(m *xdsmatcherv3.Matcher, path string) (bool, error) {
	if m.GetMatcherTree() != nil {
		return false, errors.New("matcher_tree is not understood here")
	}
	for _, fm := range m.GetMatcherList().GetMatchers() {
		hit, err := predicateMatches(fm.GetPredicate(), path)
		if err != nil {
			return false, err
		}
		if hit {
			return onMatchRuns(fm.GetOnMatch(), path)
		}
	}
	if m.GetOnNoMatch() == nil {
		return true, nil
	}
	return onMatchRuns(m.GetOnNoMatch(), path)
}

func onMatchRuns(om *xdsmatcherv3.Matcher_OnMatch, path string) (bool, error) {
	if nested := om.GetMatcher(); nested != nil {
		return runsFor(nested, path)
	}
	if om.GetAction().GetTypedConfig().MessageIs(&matchactionv3.SkipFilter{}) {
		return false, nil
	}
	return true, nil
}

func predicateMatches(p *xdsmatcherv3.Matcher_MatcherList_Predicate, path string) (bool, error) {
	switch m := p.GetMatchType().(type) {
	case *xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate_:
		return singleMatches(m.SinglePredicate, path)
	case *xdsmatcherv3.Matcher_MatcherList_Predicate_OrMatcher:
		for _, q := range m.OrMatcher.GetPredicate() {
			hit, err := predicateMatches(q, path)
			if err != nil || hit {
				return hit, err
			}
		}
		return false, nil
	case *xdsmatcherv3.Matcher_MatcherList_Predicate_AndMatcher:
		for _, q := range m.AndMatcher.GetPredicate() {
			hit, err := predicateMatches(q, path)
			if err != nil || !hit {
				return false, err
			}
		}
		return true, nil
	case *xdsmatcherv3.Matcher_MatcherList_Predicate_NotMatcher:
		hit, err := predicateMatches(m.NotMatcher, path)
		return !hit, err
	}
	return false, fmt.Errorf("predicate %T is not understood here", p.GetMatchType())
}

func singleMatches(sp *xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate, path string) (bool, error) {
	var in matcherv3.HttpRequestHeaderMatchInput
	if err := sp.GetInput().GetTypedConfig().UnmarshalTo(&in); err != nil || in.GetHeaderName() != ":path" {
		return false, fmt.Errorf("input %s is not the :path request header", sp.GetInput().GetName())
	}
	sm := sp.GetValueMatch()
	if sm == nil {
		return false, errors.New("custom_match is not understood here")
	}
	fold := func(s string) string {
		if sm.GetIgnoreCase() {
			return strings.ToLower(s)
		}
		return s
	}
	switch pat := sm.GetMatchPattern().(type) {
	case *xdsmatcherv3.StringMatcher_Exact:
		return fold(path) == fold(pat.Exact), nil
	case *xdsmatcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(fold(path), fold(pat.Prefix)), nil
	case *xdsmatcherv3.StringMatcher_Suffix:
		return strings.HasSuffix(fold(path), fold(pat.Suffix)), nil
	case *xdsmatcherv3.StringMatcher_Contains:
		return strings.Contains(fold(path), fold(pat.Contains)), nil
	case *xdsmatcherv3.StringMatcher_SafeRegex:
		// Envoy matches the whole value with RE2, as Go's regexp does.
		re, err := regexp.Compile(`^(?:` + pat.SafeRegex.GetRegex() + `)$`)
		if err != nil {
			return false, fmt.Errorf("failed to compile %q: %w", pat.SafeRegex.GetRegex(), err)
		}
		return re.MatchString(path), nil
	}
	return false, fmt.Errorf("string matcher %T is not understood here", sm.GetMatchPattern())
}
