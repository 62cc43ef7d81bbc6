"""`vlmserve tune`: plan every candidate configuration, measure the promising ones, recommend a spec."""
