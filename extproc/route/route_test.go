package route

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseTemplate(t *testing.T) {
	for _, tc := range []struct {
		path string
		err  string
		vars []string
	}{
		{path: "/v1/transfers/confirm"},
		{path: "/"},
		{path: "/v1/accounts/{account}/transfers/{id}", vars: []string{"account", "id"}},
		{path: "", err: "empty path"},
		{path: "v1/x", err: "must start with /"},
		{path: "/v1/x?y=1", err: "must not contain a query string or fragment"},
		{path: "/v1//x", err: "must not contain empty segments (// or a trailing /)"},
		{path: "/v1/x/", err: "must not contain empty segments (// or a trailing /)"},
		{path: "/v1/acc-{id}", err: `segment "acc-{id}": a variable must be a whole segment {name}`},
		{path: "/v1/{1x}", err: `segment "{1x}": variable names are a letter or _ followed by letters, digits or _`},
		{path: "/v1/{a}/{a}", err: "variable {a} appears twice"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			tmpl, err := ParseTemplate(tc.path)
			if tc.err != "" {
				require.EqualError(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.vars, tmpl.Vars())
			require.Equal(t, tc.path, tmpl.String())
		})
	}
}

func TestTableMatch(t *testing.T) {
	table, err := NewTable([]Entry[string]{
		{Method: "POST", Path: "/v1/transfers/confirm", Value: "confirm"},
		{Method: "POST", Path: "/v1/accounts/{account}/transfers/{id}", Value: "templated"},
		{Method: "POST", Path: "/v1/accounts/main/transfers/{id}", Value: "specific"},
		{Method: "GET", Path: "/", Value: "root"},
	})
	require.NoError(t, err)
	for _, tc := range []struct {
		method, path string
		want         string
		vars         map[string]string
		ok           bool
	}{
		{method: "POST", path: "/v1/transfers/confirm", want: "confirm", ok: true},
		{method: "POST", path: "/v1/transfers/confirm?x=1&y", want: "confirm", ok: true},
		{method: "GET", path: "/v1/transfers/confirm"},
		{method: "POST", path: "/v1/transfers/confirm/"},
		{method: "POST", path: "/v1/transfers"},
		{method: "POST", path: "/v1/accounts/a1/transfers/t9", want: "templated", vars: map[string]string{"account": "a1", "id": "t9"}, ok: true},
		{method: "POST", path: "/v1/accounts/main/transfers/t9?q", want: "specific", vars: map[string]string{"id": "t9"}, ok: true},
		{method: "POST", path: "/v1/accounts//transfers/t9"},
		{method: "POST", path: "/v1/accounts/a1/transfers/t9/more"},
		{method: "GET", path: "/", want: "root", ok: true},
		{method: "GET", path: "/?x", want: "root", ok: true},
		{method: "GET", path: ""},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			v, vars, ok := table.Match(tc.method, tc.path)
			require.Equal(t, tc.ok, ok)
			require.Equal(t, tc.want, v)
			require.Equal(t, tc.vars, vars)
		})
	}
}

func TestTableRejectsDuplicates(t *testing.T) {
	_, err := NewTable([]Entry[int]{
		{Method: "POST", Path: "/a/{x}/b"},
		{Method: "POST", Path: "/a/{y}/b"},
		{Method: "GET", Path: "/a/{y}/b"},
		{Method: "POST", Path: "/c"},
		{Method: "POST", Path: "/c"},
		{Method: "POST", Path: "bad"},
	})
	require.EqualError(t, err, "route POST /a/{y}/b: matches the same requests as POST /a/{x}/b\n"+
		"route POST /c: matches the same requests as POST /c\n"+
		"route POST bad: must start with /")
}

func BenchmarkMatch(b *testing.B) {
	table, _ := NewTable([]Entry[int]{
		{Method: "POST", Path: "/v1/transfers/preview", Value: 1},
		{Method: "POST", Path: "/v1/transfers/confirm", Value: 2},
		{Method: "POST", Path: "/v1/transfers/status", Value: 3},
	})
	b.ReportAllocs()
	for b.Loop() {
		table.Match("POST", "/v1/transfers/confirm?trace=1")
	}
}
