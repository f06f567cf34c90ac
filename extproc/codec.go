package extproc

import (
	"fmt"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// requestCodec is the gRPC codec of the Envoy-facing server. It decodes
// ProcessingRequest messages without the fields idemgate does not read, and
// hands everything else to gRPC's proto codec.
//
// Envoy may attach metadata_context (the forwarded dynamic metadata, e.g.
// jwt_authn's whole JWT payload as a protobuf Struct) and attributes to
// every message of a stream. Decoding those maps of Structs is the largest
// single cost of a preview — more than parsing, hashing and signing
// together — yet idemgate reads attributes only for a preview whose
// fingerprint lives in the body alone (response.code, sent once per stream)
// and metadata only when the subject comes from it. So the top-level fields of
// the wire message are walked and the unread ones skipped: the kept runs are
// merged into the message one after the other, which is exactly what
// decoding their concatenation does.
type requestCodec struct {
	base encoding.CodecV2
	// skip lists the ProcessingRequest field numbers not decoded.
	skip []protowire.Number
}

var _ encoding.CodecV2 = requestCodec{}

// newRequestCodec returns the codec; with keepMetadata (the subject comes
// from dynamic metadata) metadata_context is decoded as usual, with
// keepAttributes (a preview reads response.code, preview.fingerprint_header:
// false) attributes are.
func newRequestCodec(keepMetadata, keepAttributes bool) requestCodec {
	c := requestCodec{base: encoding.GetCodecV2(grpcproto.Name)}
	fields := (&extprocv3.ProcessingRequest{}).ProtoReflect().Descriptor().Fields()
	if !keepAttributes {
		c.skip = append(c.skip, fields.ByName("attributes").Number())
	}
	if !keepMetadata {
		c.skip = append(c.skip, fields.ByName("metadata_context").Number())
	}
	return c
}

// Name is the codec's content-subtype: it replaces the proto codec.
func (c requestCodec) Name() string { return grpcproto.Name }

// Marshal is the proto codec's.
func (c requestCodec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

// Unmarshal decodes a ProcessingRequest without the skipped fields, any
// other message as the proto codec does.
func (c requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	req, ok := v.(*extprocv3.ProcessingRequest)
	if !ok {
		return c.base.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return c.decode(buf.ReadOnlyData(), req)
}

var mergeOptions = proto.UnmarshalOptions{Merge: true}

func (c requestCodec) decode(b []byte, req *extprocv3.ProcessingRequest) error {
	req.Reset()
	runStart := 0
	for i := 0; i < len(b); {
		num, typ, n := protowire.ConsumeTag(b[i:])
		if n < 0 {
			return fmt.Errorf("failed to decode ProcessingRequest: %w", protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[i+n:])
		if m < 0 {
			return fmt.Errorf("failed to decode ProcessingRequest: %w", protowire.ParseError(m))
		}
		end := i + n + m
		if c.skipped(num) {
			if err := mergeOptions.Unmarshal(b[runStart:i], req); err != nil {
				return err
			}
			runStart = end
		}
		i = end
	}
	return mergeOptions.Unmarshal(b[runStart:], req)
}

func (c requestCodec) skipped(num protowire.Number) bool {
	for _, s := range c.skip {
		if s == num {
			return true
		}
	}
	return false
}
