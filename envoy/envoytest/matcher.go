package envoytest

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	xdsmatcherv3 "github.com/cncf/xds/go/xds/type/matcher/v3"
	matchingv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/matching/v3"
	matchactionv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/common/matcher/action/v3"
	compositev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/composite/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// unwrapMatcher returns the filter an ExtensionWithMatcher wraps, unpacked,
// its matcher, and whether it is delegated to by a composite filter; any
// other config is returned as is with a nil matcher.
//
// Two shapes exist. ExtensionWithMatcher around the filter itself: the filter
// runs unless the matcher's action is SkipFilter. ExtensionWithMatcher around
// envoy.filters.http.composite: the filter named by the ExecuteFilterAction
// runs only where the matcher selects that action (the composite does nothing
// otherwise). The composite's actions must all name one filter config: this
// view has one Config per filter.
func unwrapMatcher(m proto.Message) (proto.Message, *xdsmatcherv3.Matcher, bool, error) {
	ewm, ok := m.(*matchingv3.ExtensionWithMatcher)
	if !ok {
		return m, nil, false, nil
	}
	if ewm.GetXdsMatcher() == nil {
		return nil, nil, false, errors.New("ExtensionWithMatcher without xds_matcher (the deprecated matcher field is not understood here)")
	}
	inner, err := anypb.UnmarshalNew(ewm.GetExtensionConfig().GetTypedConfig(), proto.UnmarshalOptions{})
	if err != nil {
		return nil, nil, false, fmt.Errorf("failed to unpack the wrapped filter %q: %w", ewm.GetExtensionConfig().GetName(), err)
	}
	if _, composite := inner.(*compositev3.Composite); !composite {
		return inner, ewm.GetXdsMatcher(), false, nil
	}
	var delegated *anypb.Any
	var walkErr error
	walkActions(ewm.GetXdsMatcher(), func(a *anypb.Any) {
		var exec compositev3.ExecuteFilterAction
		switch {
		case walkErr != nil:
		case a.MessageIs(&matchactionv3.SkipFilter{}):
		case a.MessageIs(&exec):
			if err := a.UnmarshalTo(&exec); err != nil {
				walkErr = err
				return
			}
			cfg := exec.GetTypedConfig().GetTypedConfig()
			if cfg == nil {
				walkErr = errors.New("an ExecuteFilterAction without typed_config (dynamic_config and filter_chain are not understood here)")
			} else if delegated != nil && !proto.Equal(delegated, cfg) {
				walkErr = errors.New("the composite's actions delegate to different filter configs")
			}
			delegated = cfg
		default:
			walkErr = fmt.Errorf("composite action %s is not understood here", a.GetTypeUrl())
		}
	})
	if walkErr != nil {
		return nil, nil, false, walkErr
	}
	if delegated == nil {
		return nil, nil, false, errors.New("a composite filter whose matcher executes no filter")
	}
	filter, err := anypb.UnmarshalNew(delegated, proto.UnmarshalOptions{})
	if err != nil {
		return nil, nil, false, fmt.Errorf("failed to unpack the composite's filter: %w", err)
	}
	return filter, ewm.GetXdsMatcher(), true, nil
}

// walkActions calls visit with the typed_config of every action m can select.
func walkActions(m *xdsmatcherv3.Matcher, visit func(*anypb.Any)) {
	if m == nil {
		return
	}
	oms := []*xdsmatcherv3.Matcher_OnMatch{m.GetOnNoMatch()}
	for _, fm := range m.GetMatcherList().GetMatchers() {
		oms = append(oms, fm.GetOnMatch())
	}
	for _, om := range oms {
		if om == nil {
			continue
		}
		if nested := om.GetMatcher(); nested != nil {
			walkActions(nested, visit)
			continue
		}
		visit(om.GetAction().GetTypedConfig())
	}
}

// RunsFor reports whether a filter wrapped in an ExtensionWithMatcher runs
// for a request with :path path, as Envoy decides it: the first matching
// field matcher's action (or on_no_match) decides; SkipFilter skips the
// filter, a composite's ExecuteFilterAction runs it, and where no action is
// selected a plain wrapped filter runs and a delegated one does not. A filter
// without a matcher always runs. Only :path inputs, string matchers and
// and/or/not are understood; anything else is an error, never a guess.
func (f Filter) RunsFor(path string) (bool, error) {
	if f.Matcher == nil {
		return true, nil
	}
	return runsFor(f.Matcher, path, f.Delegated)
}

func runsFor(m *xdsmatcherv3.Matcher, path string, delegated bool) (bool, error) {
	if m.GetMatcherTree() != nil {
		return false, errors.New("matcher_tree is not understood here")
	}
	for _, fm := range m.GetMatcherList().GetMatchers() {
		hit, err := predicateMatches(fm.GetPredicate(), path)
		if err != nil {
			return false, err
		}
		if hit {
			return onMatchRuns(fm.GetOnMatch(), path, delegated)
		}
	}
	if m.GetOnNoMatch() == nil {
		return !delegated, nil
	}
	return onMatchRuns(m.GetOnNoMatch(), path, delegated)
}

func onMatchRuns(om *xdsmatcherv3.Matcher_OnMatch, path string, delegated bool) (bool, error) {
	if nested := om.GetMatcher(); nested != nil {
		return runsFor(nested, path, delegated)
	}
	action := om.GetAction().GetTypedConfig()
	if action.MessageIs(&matchactionv3.SkipFilter{}) {
		return false, nil
	}
	if delegated {
		// unwrapMatcher accepted only SkipFilter and ExecuteFilterAction.
		return action.MessageIs(&compositev3.ExecuteFilterAction{}), nil
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

// EditWrapped applies edit to the T that typed (an HTTP filter's
// typed_config) configures: T itself, T wrapped in an ExtensionWithMatcher,
// or T delegated to by the actions of a composite filter (each of them). It
// returns the re-packed config and fails when typed holds no T.
func EditWrapped[T any, PT interface {
	*T
	proto.Message
}](typed *anypb.Any, edit func(PT)) (*anypb.Any, error) {
	msg, err := anypb.UnmarshalNew(typed, proto.UnmarshalOptions{})
	if err != nil {
		return nil, err
	}
	if t, ok := msg.(PT); ok {
		edit(t)
		return anypb.New(t)
	}
	ewm, ok := msg.(*matchingv3.ExtensionWithMatcher)
	if !ok {
		return nil, fmt.Errorf("%s is neither %T nor wraps it", typed.GetTypeUrl(), PT(nil))
	}
	ext := ewm.GetExtensionConfig()
	if !ext.GetTypedConfig().MessageIs(&compositev3.Composite{}) {
		if ext.TypedConfig, err = EditWrapped(ext.GetTypedConfig(), edit); err != nil {
			return nil, err
		}
		return anypb.New(ewm)
	}
	edited := 0
	var editErr error
	walkActions(ewm.GetXdsMatcher(), func(a *anypb.Any) {
		var exec compositev3.ExecuteFilterAction
		if editErr != nil || !a.MessageIs(&exec) {
			return
		}
		if editErr = a.UnmarshalTo(&exec); editErr != nil {
			return
		}
		tc := exec.GetTypedConfig()
		if tc.TypedConfig, editErr = EditWrapped(tc.GetTypedConfig(), edit); editErr != nil {
			return
		}
		// walkActions hands out the Any held by the matcher: re-pack in place.
		editErr = a.MarshalFrom(&exec)
		edited++
	})
	if editErr != nil {
		return nil, editErr
	}
	if edited == 0 {
		return nil, fmt.Errorf("the composite filter delegates to no %T", PT(nil))
	}
	return anypb.New(ewm)
}
