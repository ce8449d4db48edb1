"""The builder: consumes table topics, builds superfiles and commits manifests."""
