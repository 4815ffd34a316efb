"""Glue to other frameworks: ``lightning`` (``ShardDataModule``)."""
