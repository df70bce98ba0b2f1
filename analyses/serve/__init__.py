"""Serving simulation: arrivals, continuous batching and SLOs over every schedule (analyses.serve.api)."""
