"""Benchmarks of mpcml's data plane; `make bench` runs `bench/transport.py`."""
