"""Writers that pack an image folder into a fastdata shard set (entry: ``converters.convert``)."""
