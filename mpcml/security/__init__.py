"""Certificates and identities."""
