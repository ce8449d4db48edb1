"""The commit pipeline, one module per stage: stage -> shard -> build -> summarize -> publish."""
