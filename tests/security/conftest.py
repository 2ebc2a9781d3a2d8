"""Fixtures of the security tests: the metadata tests' `kv`, one store per backend."""

from tests.metadata.conftest import backend, kv

__all__ = ["backend", "kv"]
