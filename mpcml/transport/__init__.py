"""The data plane: CrypTen's communication over gRPC streams between parties, with mutual TLS."""
