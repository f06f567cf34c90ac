// Package envoytest decodes idemgate's Envoy YAML strictly into the
// go-control-plane v3 types and checks the invariants idemgate relies on: a
// field Envoy would reject (unknown name, wrong type, failed proto validation
// rule, unresolvable typed_config) fails here with a path to it, and the
// checks say what idemgate needs beyond what Envoy accepts. It also finds the
// pinned Envoy binary and runs `envoy --mode validate` (binary.go), which is
// the final word on whether Envoy accepts a config.
//
// The tests of envoy/ and k8s/ use it on every Envoy config we ship. The e2e
// stacks, the load benchmark and the demo run the shipped envoy/envoy.yaml
// through it too: RenderBootstrap makes their edits (addresses, timeouts,
// the ext_proc filter dropped) and Start runs Envoy on the result
// (process.go).
package envoytest

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"
)

// UnmarshalYAML decodes Envoy YAML into m the strict way: duplicate keys,
// unknown fields and typed_config types that are not registered are errors,
// and m (with every Any inside it) must pass its proto validation rules.
func UnmarshalYAML(data []byte, m proto.Message) error {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return fmt.Errorf("failed to convert YAML to JSON: %w", err)
	}
	return UnmarshalJSON(js, m)
}

// UnmarshalJSON is UnmarshalYAML for input that is already JSON (for example
// the `value` of an Istio EnvoyFilter patch).
func UnmarshalJSON(js []byte, m proto.Message) error {
	opts := protojson.UnmarshalOptions{DiscardUnknown: false}
	if err := opts.Unmarshal(js, m); err != nil {
		return fmt.Errorf("failed to decode %s: %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	return Validate(m)
}

// UnmarshalPartialJSON decodes a fragment that will be merged into a larger
// message (an Istio EnvoyFilter MERGE patch). Unknown fields and unresolvable
// typed_config types are still errors; validation rules are not run, because a
// fragment leaves its required fields to the message it is merged into.
func UnmarshalPartialJSON(js []byte, m proto.Message) error {
	opts := protojson.UnmarshalOptions{DiscardUnknown: false}
	if err := opts.Unmarshal(js, m); err != nil {
		return fmt.Errorf("failed to decode %s: %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	return nil
}

// validator is implemented by every go-control-plane message (protoc-gen-validate).
type validator interface{ ValidateAll() error }

// Validate runs the proto validation rules of m and of every message packed
// in an Any anywhere inside it. ValidateAll alone stops at an Any: it checks
// the type URL, not the packed filter config, which is where most of our
// settings live.
func Validate(m proto.Message) error {
	var errs []error
	if v, ok := m.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m.ProtoReflect().Descriptor().FullName(), err))
		}
	}
	walkAnys(m.ProtoReflect(), func(path string, a *anypb.Any) {
		inner, err := anypb.UnmarshalNew(a, proto.UnmarshalOptions{})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: failed to resolve %s: %w", path, a.GetTypeUrl(), err))
			return
		}
		if untyped[inner.ProtoReflect().Descriptor().FullName()] {
			errs = append(errs, fmt.Errorf("%s: %s hides its fields from validation; use the typed config", path, a.GetTypeUrl()))
			return
		}
		if err := Validate(inner); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
		}
	})
	return errors.Join(errs...)
}

// untyped lists wrappers that carry a config as a free-form Struct; Envoy
// converts them at load time, so nothing here could check their fields.
var untyped = map[protoreflect.FullName]bool{
	"xds.type.v3.TypedStruct":  true,
	"udpa.type.v1.TypedStruct": true,
	"google.protobuf.Struct":   true,
}

// walkAnys calls visit for every Any directly inside m (fields, lists and map
// values, at any depth), without descending into the Anys themselves:
// Validate does that after unpacking them.
func walkAnys(m protoreflect.Message, visit func(path string, a *anypb.Any)) {
	walk(m, string(m.Descriptor().FullName()), visit)
}

func walk(m protoreflect.Message, path string, visit func(string, *anypb.Any)) {
	if a, ok := m.Interface().(*anypb.Any); ok {
		visit(path, a)
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := path + "." + string(fd.Name())
		switch {
		case fd.IsMap():
			if fd.MapValue().Kind() == protoreflect.MessageKind {
				v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
					walk(mv.Message(), fmt.Sprintf("%s[%s]", p, k.String()), visit)
					return true
				})
			}
		case fd.IsList():
			if fd.Kind() == protoreflect.MessageKind {
				l := v.List()
				for i := range l.Len() {
					walk(l.Get(i).Message(), fmt.Sprintf("%s[%d]", p, i), visit)
				}
			}
		case fd.Kind() == protoreflect.MessageKind:
			walk(v.Message(), p, visit)
		}
		return true
	})
}
