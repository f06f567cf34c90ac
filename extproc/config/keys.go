package config

import "sort"

// keySection is what differs between the key sets of idemgate.yaml: the
// fingerprint's signing keys and the attestation keys.
type keySection struct {
	name    string // the top-level key: signing, attestation
	what    string // the secret, in messages: "signing key"
	example string // a key entry, for the "at least one key" message
	standIn string // the offline check's stand-in
}

// readKeys checks a key set's active_key and keys, reads every key's
// secret in id order and turns it into K with parse (which reports its own
// problems at path and says whether the key is usable). ok is false when
// any problem was found; sources are where each usable key came from.
func readKeys[K any](c *compiler, sec keySection, active string, srcs map[string]KeySource,
	parse func(path []any, from, text string) (K, bool)) (keys map[string]K, sources map[string]string, ok bool) {
	ok = true
	if active == "" {
		c.errorf(p(sec.name, "active_key"), "required")
		ok = false
	}
	if len(srcs) == 0 {
		c.errorf(p(sec.name, "keys"), "required: at least one key, e.g. %s", sec.example)
		return nil, nil, false
	}
	if _, found := srcs[active]; active != "" && !found {
		c.errorf(p(sec.name, "active_key"), "names key %q, which is not under %s.keys", active, sec.name)
		ok = false
	}
	ids := make([]string, 0, len(srcs))
	for id := range srcs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	keys = make(map[string]K, len(ids))
	sources = make(map[string]string, len(ids))
	for _, id := range ids {
		src := srcs[id]
		path := p(sec.name, "keys", id)
		if !keyIDPattern.MatchString(id) {
			c.keyErrorf(path, "key id %q must be 1-64 characters of A-Z a-z 0-9 . _ -", id)
			ok = false
			continue
		}
		text, from, found := c.secret(path, SecretRef{What: sec.what, EnvKey: "env", Env: src.Env, FileKey: "file", File: src.File, StandIn: sec.standIn})
		if !found {
			ok = false
			continue
		}
		key, usable := parse(path, from, text)
		if !usable {
			ok = false
			continue
		}
		keys[id] = key
		sources[id] = from
	}
	return keys, sources, ok
}
