"""Generated protobuf and gRPC code for the `mpcml.v1` API (committed; `make proto` regenerates)."""
