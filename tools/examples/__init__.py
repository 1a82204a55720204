"""Runnable examples of using decisions: over HTTP, in process, on a Ray cluster."""
