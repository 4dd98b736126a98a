"""The demo: its model architectures and the example parties' private data (see parties/)."""
