"""Postgres: schema migrations and the batched, idempotent writer."""
