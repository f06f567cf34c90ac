package jsonx

import (
	"github.com/go-json-experiment/json/jsontext"
)

// Nested is an object read in one pass together with the members of one of
// its members (a JSON-RPC message and its params): routing reads both, and
// reading the inner object again would check its bytes twice.
type Nested struct {
	// Members are the object's members; Inner those of the member named
	// by ReadNested's inner when its value is an object (nil otherwise).
	Members, Inner []Member
	// Depth is how deeply the object nests (the object itself is 1), so a
	// caller can apply a limit that depends on what the members say.
	Depth int
}

// ReadNested reads the strict JSON object raw, the members of its member
// named inner, and its nesting depth, in one pass.
func ReadNested(raw []byte, inner string) (Nested, error) {
	return readNested(raw, inner, false, true)
}

// ReadInner is ReadNested without the depth (left 0): nested values are
// checked whole rather than token by token, which is faster, for a caller
// that applies no depth limit (an upstream's answer).
func ReadInner(raw []byte, inner string) (Nested, error) {
	return readNested(raw, inner, false, false)
}

// LaxNested is ReadNested under Lax's rules, only to word a refusal.
func LaxNested(raw []byte, inner string) Nested {
	n, _ := readNested(raw, inner, true, true)
	return n
}

func readNested(raw []byte, inner string, lax, trackDepth bool) (Nested, error) {
	r := getReader(raw, lax)
	defer putReader(r)
	d := &r.dec
	var n Nested
	if d.PeekKind() != '{' {
		if err := Check(raw); err != nil && !lax {
			return Nested{}, err
		}
		return Nested{}, ErrNotObject
	}
	var err error
	depth := &n.Depth
	if !trackDepth {
		depth = nil
	}
	n.Members, err = readObject(d, raw, lax, depth, func(name []byte) bool { return string(name) == inner }, &n.Inner)
	if err != nil {
		return Nested{}, err
	}
	if err := r.end(); err != nil {
		return Nested{}, err
	}
	return n, nil
}

// readObject reads the object that comes next, its members' values token by
// token so that depth records the deepest nesting (each value whole when
// depth is nil); the members of the one member object that descend picks
// are read into inner on the way. members keeps a loop of its own: storing
// inner makes this function's result escape, and a caller's stack array
// passed to MembersInto must not.
func readObject(d *jsontext.Decoder, raw []byte, lax bool, depth *int, descend func([]byte) bool, inner *[]Member) ([]Member, error) {
	if _, err := d.ReadToken(); err != nil {
		return nil, fail(err, d.InputOffset())
	}
	if depth != nil {
		*depth = max(*depth, d.StackDepth())
	}
	// Room for a JSON-RPC message's members (and most params and results)
	// in one allocation rather than growing from one.
	ms := make([]Member, 0, 4)
	for d.PeekKind() != '}' {
		key, start, err := readName(d, lax)
		if err != nil {
			return nil, err
		}
		var from int
		switch k := d.PeekKind(); {
		case descend != nil && descend(key) && k == '{':
			from = int(d.InputOffset())
			im, err := readObject(d, raw, lax, depth, nil, nil)
			if err != nil {
				return nil, err
			}
			*inner = im
			from = valueStart(raw, from)
		case depth != nil && (k == '{' || k == '['):
			from = int(d.InputOffset())
			if err := skipTracked(d, depth); err != nil {
				return nil, err
			}
			from = valueStart(raw, from)
		default:
			v, err := d.ReadValue()
			if err != nil {
				return nil, fail(err, d.InputOffset())
			}
			from = int(d.InputOffset()) - len(v)
		}
		end := int(d.InputOffset())
		ms = append(ms, Member{Name: key, Value: raw[from:end:end], start: start, end: end})
	}
	if _, err := d.ReadToken(); err != nil {
		return nil, fail(err, d.InputOffset())
	}
	return ms, nil
}

// valueStart is where the value after a member name begins: past the
// whitespace and the colon that follow the name at offset from.
func valueStart(raw []byte, from int) int {
	for from < len(raw) {
		switch raw[from] {
		case ' ', '\t', '\n', '\r', ':':
			from++
		default:
			return from
		}
	}
	return from
}

// skipTracked reads the object or array that comes next token by token,
// recording the deepest nesting in depth.
func skipTracked(d *jsontext.Decoder, depth *int) error {
	level := d.StackDepth()
	for {
		if _, err := d.ReadToken(); err != nil {
			return fail(err, d.InputOffset())
		}
		*depth = max(*depth, d.StackDepth())
		if d.StackDepth() == level {
			return nil
		}
	}
}
