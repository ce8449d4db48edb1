"""Spark Structured Streaming to Supertable topics."""
