"""Writers that pack an image folder into a fastdata shard set; installed as
``fastdata.converters`` (entry point: ``fastdata.converters.convert.convert``)."""
