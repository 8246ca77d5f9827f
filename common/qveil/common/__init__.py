"""qveil.common: the wire layer that the server and the SDK both stand on (neither imports the
other): the API's types (``typing``), their protobuf mapping (``serde``) and the errors on the
wire (``errors``: a domain exception as a gRPC status, a failed call as a typed exception).
It needs numpy, grpcio, protobuf and the generated stubs ``qveil.v1``, nothing else, so the
light client distribution (``pip install ./client``) ships it."""
