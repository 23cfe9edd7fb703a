package guardtest

import (
	"fmt"

	"google.golang.org/protobuf/proto"
)

// RawCodec is a gRPC codec (grpc.ForceCodec) for clients that send
// request messages as bytes they made themselves (a fuzzer's bytes, or a
// large message encoded once and sent again and again without a copy)
// and read the server's answers as protobuf, decoded as the server's
// real clients decode them.
type RawCodec struct{}

// Marshal sends a []byte as it is and a proto.Message encoded.
func (RawCodec) Marshal(v any) ([]byte, error) {
	switch m := v.(type) {
	case []byte:
		return m, nil
	case proto.Message:
		return proto.Marshal(m)
	}
	return nil, fmt.Errorf("cannot send %T", v)
}

// Unmarshal decodes an answer as protobuf.
func (RawCodec) Unmarshal(data []byte, v any) error { return proto.Unmarshal(data, v.(proto.Message)) }

// Name is "proto": the server sees the content type its real clients send.
func (RawCodec) Name() string { return "proto" }
