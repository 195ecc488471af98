"""Offline and online data stages: corpus reading, segmentation, instances, shards, masking."""
