"""The `mpcml` command line."""
