"""vlmserve tests."""
