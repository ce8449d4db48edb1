"""Manifests: typed version metadata, summaries for pruning, and their storage."""
